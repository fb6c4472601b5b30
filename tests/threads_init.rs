//! `threads::init` builds the global pool once, with the calling thread in
//! it (its own binary: the global pool is per process).

use leangrad::threads;
use leangrad::{DType, Device, Error, Tensor};

#[test]
fn init_makes_the_caller_one_of_the_pools_threads_once() {
    assert!(matches!(
        threads::init(Some(0)),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(threads::init(Some(3)).expect("the first init"), 3);
    assert_eq!(rayon::current_num_threads(), 3);
    // The caller is worker 0: parallel loops start on it.
    assert_eq!(rayon::current_thread_index(), Some(0));
    let again = threads::init(Some(2));
    assert!(
        matches!(&again, Err(Error::InvalidArgument { msg, .. }) if msg.contains("already built")),
        "{again:?}"
    );
    // Ops run on the pool as before.
    let a = Tensor::ones(&[300, 400], DType::F32, Device::Cpu).expect("ones");
    let b = Tensor::ones(&[400, 200], DType::F32, Device::Cpu).expect("ones");
    let c = a
        .matmul(&b)
        .expect("matmul")
        .to_vec::<f32>()
        .expect("values");
    assert_eq!(c.len(), 300 * 200);
    assert!(c.iter().all(|&v| v == 400.0));
}
