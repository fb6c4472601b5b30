//! `leangrad launch`: one process per rank with torchrun's environment,
//! the first failure's exit code returned and the other ranks stopped.
use std::process::Command;
use std::time::{Duration, Instant};

fn leangrad() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leangrad"))
}

#[test]
fn each_rank_gets_torchruns_environment() {
    let out = leangrad()
        .args(["launch", "--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1"])
        .args(["--master-addr", "10.1.2.3", "--master-port", "29611", "--"])
        .args(["sh", "-c", "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR:$MASTER_PORT"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "3 6 0 3 1 10.1.2.3:29611",
            "4 6 1 3 1 10.1.2.3:29611",
            "5 6 2 3 1 10.1.2.3:29611"
        ]
    );
}

#[test]
fn a_failing_rank_stops_the_others_and_gives_its_exit_code() {
    let start = Instant::now();
    let out = leangrad()
        .args(["launch", "--nproc-per-node", "3", "--"])
        .args(["sh", "-c", "if [ $RANK = 1 ]; then exit 7; fi; sleep 60"])
        .output()
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 exited with code 7"), "{err}");
}

#[test]
fn bad_launches_are_clear_errors() {
    let out = leangrad()
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node-rank 2 is not below --nnodes 2"));
    let out = leangrad()
        .args(["launch", "--nproc-per-node", "2", "--", "/no/such/program"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot start") && err.contains("/no/such/program"),
        "{err}"
    );
}
