//! Data parallel training through `leangrad launch` on the simulated GPU:
//! two simulated machines (two launches, node ranks 0 and 1) of two devices
//! each, four rank processes. Each rank is this test binary run again
//! (`rank_program`): it joins the group from the launcher's environment,
//! trains the tiny BERT classifier for three steps on its rows of every
//! batch (usual DDP with SGD momentum, or sharded state with the fused
//! step) and writes its parameters to a file. All four ranks must agree bit
//! for bit, and with one device trained on the whole batch within the bound
//! of `tests/cuda_ddp.rs`. A rank that exits with an error ends both
//! launches, with an error, in bounded time.
mod cuda_common;

use leangrad::distributed::{DdpOptions, DistributedDataParallel, InitOptions, ShardedOptimizer};
use leangrad::models::{BertClassifier, BertConfig};
use leangrad::nn::Module;
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Optimizer, Sgd};
use leangrad::{DType, Device, Result, Tensor};
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set in a rank's environment: what it runs (`usual`, `sharded`, `fail`).
const CHILD: &str = "LEANGRAD_TEST_LAUNCH_CHILD";
/// Set in a rank's environment: the folder of the parameter files.
const OUT_DIR: &str = "LEANGRAD_TEST_LAUNCH_OUT";
/// Set in a rank's environment: the rank that exits with code 3 at once.
const FAIL_RANK: &str = "LEANGRAD_TEST_LAUNCH_FAIL_RANK";
/// Machines, devices per machine, ranks.
const NODES: usize = 2;
const PER_NODE: usize = 2;
const WORLD: usize = NODES * PER_NODE;
/// Rows of each rank's share of a batch, and steps.
const ROWS: usize = 2;
const STEPS: usize = 3;
/// As `tests/cuda_ddp.rs`: f32 sums in another order through three steps.
const BOUND: f64 = 1e-6;
/// How long the launches of a training run may take before they are stopped.
const TRAIN_LIMIT: Duration = Duration::from_secs(540);
/// How long the launches of the failing run may take.
const FAIL_LIMIT: Duration = Duration::from_secs(180);

fn build(device: Device, seed: u64) -> BertClassifier {
    BertClassifier::new(BertConfig::tiny(), 3, DType::F32, device, seed).unwrap()
}

/// Rows `rows` of the whole batch of step `step` (as `tests/cuda_ddp.rs`).
fn batch(step: usize, rows: Range<usize>, device: Device) -> (Tensor, Tensor) {
    let salt = step * 7;
    let n = rows.len();
    let ids: Vec<i64> = rows
        .clone()
        .flat_map(|r| (0..8).map(move |c| ((r * 7 + c * 3 + salt * 11) % 49 + 1) as i64))
        .collect();
    let labels: Vec<i64> = rows.map(|r| ((r + salt) % 3) as i64).collect();
    let x = Tensor::from_vec(ids, &[n, 8], Device::Cpu).unwrap();
    let labels = Tensor::from_vec(labels, &[n], Device::Cpu).unwrap();
    (
        x.to_device(device).unwrap(),
        labels.to_device(device).unwrap(),
    )
}

fn loss_of(model: &dyn Module, step: usize, rows: Range<usize>, device: Device) -> Result<Tensor> {
    let (x, labels) = batch(step, rows, device);
    model
        .forward(&x)?
        .cross_entropy(&labels, CrossEntropyOptions::default())
}

fn sgd() -> Sgd {
    Sgd::new(0.05).momentum(0.9)
}

fn values(model: &dyn Module) -> Result<Vec<Vec<f32>>> {
    model
        .parameters()
        .iter()
        .map(|p| p.to_device(Device::Cpu)?.to_vec::<f32>())
        .collect()
}

/// One rank, as `leangrad launch` starts it: its parameters after training
/// go to `rank-R.bin`; then it leaves the group, rank 0 last (gpusim's
/// communicator lives in the process that made the NCCL id: rank 0's).
fn rank_main(mode: &str, out: &Path) -> Result<()> {
    let opts = InitOptions::from_env()?.timeout(Duration::from_secs(120));
    let rank = opts.rank;
    let group = Arc::new(opts.init()?);
    let fail = std::env::var(FAIL_RANK).ok().and_then(|r| r.parse().ok());
    if mode == "fail" && fail == Some(rank) {
        eprintln!("rank {rank}: exiting with code 3 before the first collective");
        std::process::exit(3);
    }
    let device = group.device();
    let mine = rank * ROWS..(rank + 1) * ROWS;
    let params = {
        // Every rank starts from other values: the wrapper gives them rank 0's.
        let ddp = DistributedDataParallel::new(
            build(device, 100 + rank as u64),
            group.clone(),
            DdpOptions::default(),
        )?;
        if mode == "sharded" {
            let mut opt = ShardedOptimizer::new(ddp.parameters(), sgd(), group.clone())?;
            for step in 0..STEPS {
                let loss = loss_of(&ddp, step, mine.clone(), device)?;
                ddp.data_parallel().backward_step_sharded(&mut opt, &loss)?;
            }
        } else {
            let mut opt = Optimizer::new(ddp.parameters(), sgd())?;
            for step in 0..STEPS {
                ddp.backward(&loss_of(&ddp, step, mine.clone(), device)?)?;
                opt.step()?;
                opt.zero_grad();
            }
        }
        values(&ddp)?
    };
    let mut bytes = Vec::new();
    for p in &params {
        bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
        bytes.extend(p.iter().flat_map(|v| v.to_le_bytes()));
    }
    let path = out.join(format!("rank-{rank}.bin"));
    fs::write(path.with_extension("tmp"), bytes)?;
    fs::rename(path.with_extension("tmp"), &path)?;
    if rank != 0 {
        drop(group);
        fs::write(out.join(format!("left-{rank}")), b"")?;
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(1..WORLD).all(|r| out.join(format!("left-{r}")).exists()) {
        if Instant::now() > deadline {
            return Err(leangrad::Error::Distributed {
                rank,
                msg: "the other ranks did not leave the group in 120 s".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The rank program: returns at once unless a launcher started it for
/// this test.
#[test]
fn rank_program() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let out = PathBuf::from(std::env::var_os(OUT_DIR).expect(OUT_DIR));
    if let Err(e) = rank_main(&mode, &out) {
        eprintln!("rank program ({mode}) failed: {e}");
        std::process::exit(2);
    }
}

/// The parameter files written by rank `rank`.
fn read_params(dir: &Path, rank: usize) -> Vec<Vec<f32>> {
    let bytes = fs::read(dir.join(format!("rank-{rank}.bin"))).unwrap();
    let mut rest = &bytes[..];
    let mut params = Vec::new();
    while !rest.is_empty() {
        let n = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
        let (data, tail) = rest[8..].split_at(n * 4);
        let chunks = data.chunks_exact(4);
        params.push(
            chunks
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        );
        rest = tail;
    }
    params
}

/// One launch at a time: each starts four processes on this machine.
fn one_launch_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A fresh, empty scratch folder.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("leangrad-ddp-launch-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// How one launch ended: its status (`None`: stopped at the limit) and
/// what it and its ranks printed.
struct Ended {
    status: Option<ExitStatus>,
    log: String,
}

/// Starts both machines' `leangrad launch` of `mode`, waits for both up
/// to `limit` (then stops them: the launcher stops its ranks on SIGTERM).
fn launch_both(mode: &str, dir: &Path, limit: Duration) -> Vec<Ended> {
    let exe = std::env::current_exe().unwrap();
    let port = free_port().to_string();
    let mut running: Vec<(Child, PathBuf)> = (0..NODES)
        .map(|node| {
            let log = dir.join(format!("node-{node}.log"));
            let file = fs::File::create(&log).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_leangrad"))
                .args(["launch", "--nnodes", "2", "--nproc-per-node", "2"])
                .args([
                    "--node-rank",
                    &node.to_string(),
                    "--master-addr",
                    "127.0.0.1",
                ])
                .args(["--master-port", &port, "--"])
                .arg(&exe)
                .args([
                    "--exact",
                    "rank_program",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CHILD, mode)
                .env(OUT_DIR, dir)
                .env(FAIL_RANK, "2")
                .env("GPUSIM_DEVICE_COUNT", PER_NODE.to_string())
                .env("GPUSIM_NCCL_TIMEOUT_MS", "120000")
                .stdin(Stdio::null())
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .spawn()
                .unwrap();
            (child, log)
        })
        .collect();
    let deadline = Instant::now() + limit;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; NODES];
    while statuses.iter().any(Option::is_none) && Instant::now() < deadline {
        for (s, (c, _)) in statuses.iter_mut().zip(&mut running) {
            if s.is_none() {
                *s = c.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (s, (c, _)) in statuses.iter().zip(&mut running) {
        if s.is_none() {
            stop(c);
        }
    }
    statuses
        .into_iter()
        .zip(running)
        .map(|(status, (_, log))| Ended {
            status,
            log: fs::read_to_string(log).unwrap_or_default(),
        })
        .collect()
}

/// Stops a launcher past the limit: SIGTERM (it stops its ranks), then a
/// kill if it is still there after 10 s.
fn stop(c: &mut Child) {
    #[cfg(unix)]
    // SAFETY: signals our own child, by its pid.
    unsafe {
        libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
    }
    let until = Instant::now() + Duration::from_secs(10);
    while matches!(c.try_wait(), Ok(None)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
}

fn show(ended: &[Ended]) -> String {
    let mut s = String::new();
    for (node, e) in ended.iter().enumerate() {
        s += &format!("--- node {node}: {:?}\n{}\n", e.status, e.log);
    }
    s
}

/// One device (CUDA 0 here) on the whole 8-row batch of every step.
fn one_device(fused: bool) -> Vec<Vec<f32>> {
    let device = Device::Cuda(0);
    let model = build(device, 100);
    let mut opt = Optimizer::new(model.parameters(), sgd()).unwrap();
    for step in 0..STEPS {
        let loss = loss_of(&model, step, 0..WORLD * ROWS, device).unwrap();
        if fused {
            opt.backward_step(&loss).unwrap();
        } else {
            loss.backward().unwrap();
            opt.step().unwrap();
            opt.zero_grad();
        }
    }
    values(&model).unwrap()
}

/// The largest difference relative to the largest magnitude in `reference`.
fn relative_difference(a: &[Vec<f32>], reference: &[Vec<f32>]) -> f64 {
    let flat = |v: &[Vec<f32>]| v.iter().flatten().map(|&x| x as f64).collect::<Vec<_>>();
    let (a, r) = (flat(a), flat(reference));
    assert_eq!(a.len(), r.len(), "parameter counts differ");
    let scale = r.iter().fold(0f64, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .zip(&r)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// Trains through two launches in `mode`; checks the four ranks against
/// each other and against one device.
fn train_through_launch(mode: &str, test: &str) {
    if std::env::var_os(CHILD).is_some() || cuda_common::device(test).is_none() {
        return;
    }
    let _one = one_launch_at_a_time();
    let dir = scratch(mode);
    let start = Instant::now();
    let ended = launch_both(mode, &dir, TRAIN_LIMIT);
    let took = start.elapsed();
    assert!(
        ended.iter().all(|e| e.status.is_some_and(|s| s.success())),
        "{mode}: the launches failed or were stopped after {took:?}:\n{}",
        show(&ended)
    );
    let ranks: Vec<Vec<Vec<f32>>> = (0..WORLD).map(|r| read_params(&dir, r)).collect();
    for (r, p) in ranks.iter().enumerate() {
        assert!(
            p == &ranks[0],
            "{mode}: rank {r}'s parameters differ from rank 0's"
        );
    }
    let reference = one_device(mode == "sharded");
    let d = relative_difference(&ranks[0], &reference);
    eprintln!("{mode}: 4 ranks in {took:.1?}, bit-identical; {d:.3e} from one device");
    assert!(
        d <= BOUND,
        "{mode}: {d:.3e} from one device (bound {BOUND:.0e})"
    );
    let start_values = values(&build(Device::Cuda(0), 100)).unwrap();
    assert!(
        relative_difference(&reference, &start_values) > 1e-3,
        "the run must train"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn ddp_through_two_launched_machines_of_two_gpus_trains_as_one_device() {
    train_through_launch("usual", "ddp_launch_usual");
}

#[test]
fn sharded_fused_step_through_two_launched_machines_trains_as_one_device() {
    train_through_launch("sharded", "ddp_launch_sharded");
}

#[test]
fn a_rank_that_exits_with_an_error_ends_both_launches_with_errors() {
    if std::env::var_os(CHILD).is_some() || cuda_common::device("ddp_launch_fail").is_none() {
        return;
    }
    let _one = one_launch_at_a_time();
    let dir = scratch("fail");
    let start = Instant::now();
    // Rank 2 (machine 1, local rank 0) exits with code 3 once in the group.
    let ended = launch_both("fail", &dir, FAIL_LIMIT);
    let took = start.elapsed();
    let all = show(&ended);
    eprintln!("fail: both launches ended after {took:.1?}");
    assert!(
        ended.iter().all(|e| e.status.is_some()),
        "a launch was still running after {FAIL_LIMIT:?}:\n{all}"
    );
    let code = |node: usize| ended[node].status.and_then(|s| s.code());
    assert_eq!(code(1), Some(3), "machine 1 gives rank 2's code:\n{all}");
    assert!(
        ended[1].log.contains("rank 2 exited with code 3"),
        "machine 1 names rank 2:\n{all}"
    );
    assert!(
        code(0).is_some_and(|c| c != 0),
        "machine 0 fails too:\n{all}"
    );
    assert!(
        ended[0].log.contains("ncclRemoteError"),
        "machine 0's ranks hear of it through NCCL:\n{all}"
    );
    let _ = fs::remove_dir_all(&dir);
}
