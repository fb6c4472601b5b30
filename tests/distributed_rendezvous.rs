//! The process group's TCP rendezvous and its options, on the CPU: every
//! rank gets rank 0's payload; a rank that never arrives, a port in use,
//! disagreeing world sizes and repeated ranks are typed errors within the
//! timeout on every rank, never a hang. Ranks run as threads.
use leangrad::distributed::{InitOptions, Rendezvous};
use leangrad::{Device, Error};
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A port nothing listens on now (the OS's choice, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn rendezvous(rank: usize, world_size: usize, port: u16, timeout_ms: u64) -> Rendezvous {
    Rendezvous {
        rank,
        world_size,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        timeout: Duration::from_millis(timeout_ms),
    }
}

/// Runs ranks `0..world` (with the world sizes given) in threads; rank 0
/// gives `payload`. Each rank's result, in rank order.
fn run(worlds: &[usize], ranks: &[usize], timeout_ms: u64) -> Vec<leangrad::Result<Vec<u8>>> {
    let port = free_port();
    let payload: Vec<u8> = (0..128).map(|i| (i * 7) as u8).collect();
    let handles: Vec<_> = ranks
        .iter()
        .zip(worlds)
        .map(|(&rank, &world)| {
            let payload = payload.clone();
            std::thread::spawn(move || {
                let r = rendezvous(rank, world, port, timeout_ms);
                r.exchange((rank == 0).then_some(payload.as_slice()))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn message(r: &leangrad::Result<Vec<u8>>) -> String {
    match r {
        Err(Error::Distributed { msg, .. }) => msg.clone(),
        other => panic!("expected a distributed error, got {other:?}"),
    }
}

#[test]
fn every_rank_gets_rank_zeros_payload() {
    let want: Vec<u8> = (0..128).map(|i| (i * 7) as u8).collect();
    for world in [2, 4] {
        // Rank 0 last: the others retry until it listens.
        let ranks: Vec<usize> = (1..world).chain([0]).collect();
        for got in run(&vec![world; world], &ranks, 10_000) {
            assert_eq!(got.unwrap(), want, "world {world}");
        }
    }
}

#[test]
fn a_rank_that_never_arrives_is_an_error_within_the_timeout() {
    let start = Instant::now();
    // World of 3, only ranks 0 and 1 come.
    let got = run(&[3, 3], &[0, 1], 400);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let m0 = message(&got[0]);
    assert!(m0.contains("rank(s) [2] did not arrive"), "{m0}");
    let m1 = message(&got[1]);
    assert!(m1.contains("refused") && m1.contains("[2]"), "{m1}");
    // Nobody listening at all: the joining rank gives up at its timeout.
    let alone = run(&[2], &[1], 300);
    assert!(message(&alone[0]).contains("could not reach rank 0"));
}

#[test]
fn disagreeing_world_sizes_and_repeated_ranks_are_refused_on_every_rank() {
    let got = run(&[2, 3], &[0, 1], 5_000);
    let m0 = message(&got[0]);
    assert!(
        m0.contains("rank 1 was started with world size 3, rank 0 with 2"),
        "{m0}"
    );
    assert!(message(&got[1]).contains("world size 3"));

    let got = run(&[3, 3, 3], &[1, 1, 0], 5_000);
    let m0 = message(&got[2]);
    assert!(m0.contains("two processes say they are rank 1"), "{m0}");
    for r in &got[..2] {
        assert!(r.is_err());
    }
}

#[test]
fn a_port_in_use_is_named() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let r = rendezvous(0, 2, port, 1_000).exchange(Some(&[1, 2, 3]));
    let m = message(&r);
    assert!(
        m.contains(&format!("127.0.0.1:{port}")) && m.contains("in use"),
        "{m}"
    );
}

#[test]
fn options_come_from_torchruns_variables() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let o = InitOptions::from_vars(vars(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "10.0.0.2"),
        ("MASTER_PORT", "29611"),
    ]))
    .unwrap();
    assert_eq!((o.rank, o.world_size), (3, 4));
    assert_eq!(o.device, Device::Cuda(1));
    assert_eq!((o.master_addr.as_str(), o.master_port), ("10.0.0.2", 29611));
    let o = InitOptions::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap();
    assert_eq!(o.device, Device::Cuda(0));
    assert_eq!(
        (o.master_addr.as_str(), o.master_port),
        ("127.0.0.1", 29500)
    );

    let err = |pairs| match InitOptions::from_vars(vars(pairs)) {
        Err(Error::InvalidArgument { msg, .. }) => msg,
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(err(&[("WORLD_SIZE", "2")]).contains("RANK is not set"));
    assert!(err(&[("RANK", "x"), ("WORLD_SIZE", "2")]).contains("RANK=\"x\""));
    assert!(err(&[("RANK", "2"), ("WORLD_SIZE", "2")]).contains("not below the world size"));
    assert!(err(&[("RANK", "0"), ("WORLD_SIZE", "0")]).contains("at least 1"));
    assert!(
        err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")])
            .contains("MASTER_PORT")
    );
}

#[test]
fn a_group_of_one_needs_no_network_and_keeps_tensors() {
    use leangrad::distributed::ReduceOp;
    use leangrad::{DType, Tensor};
    let group = InitOptions::new(0, 1).device(Device::Cpu).init().unwrap();
    assert_eq!((group.rank(), group.world_size()), (0, 1));
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], Device::Cpu).unwrap();
    group.all_reduce(&x, ReduceOp::Avg).unwrap();
    group.broadcast(&x, 0).unwrap();
    assert_eq!(x.to_f64_vec().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(group.all_gather(&x).unwrap().shape(), &[1, 3]);
    let y = group
        .reduce_scatter(&x.unsqueeze(0).unwrap(), ReduceOp::Sum)
        .unwrap();
    assert_eq!(y.shape(), &[3]);
    group.barrier().unwrap();
    // A CPU group of two ranks has no transport: refused at init.
    let err = InitOptions::new(0, 2).device(Device::Cpu).init().err();
    assert!(matches!(err, Some(Error::Distributed { .. })), "{err:?}");
    let other = Tensor::zeros(&[1], DType::F32, Device::Meta).unwrap();
    assert!(matches!(
        group.all_reduce(&other, ReduceOp::Sum),
        Err(Error::DeviceMismatch { .. })
    ));
}
