//! The NCCL stand-in in stream order: a kernel and a memset enqueued
//! before a collective are visible to it, a copy and a kernel after it see
//! its result; the profile records collectives where they were enqueued.

mod nccl_common;
use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::api_module::*;
use leangrad_gpusim::driver::consts::*;
use leangrad_gpusim::profile::{self, CollectiveKind, Event};
use nccl_common::*;
use std::ffi::{c_void, CString};
use std::ptr::null_mut;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let g = serial();
    init(2, None);
    g
}

/// `add_one(float* x, int n)`: x[i] += 1 for i < n (NVRTC's output).
const ADD_ONE: &str = r#"
.version 9.5
.target sm_80
.address_size 64
.visible .entry add_one(
	.param .u64 add_one_param_0,
	.param .u32 add_one_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<3>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<5>;
	ld.param.u64 	%rd1, [add_one_param_0];
	ld.param.u32 	%r2, [add_one_param_1];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.s32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.global.f32 	%f1, [%rd4];
	add.rn.f32 	%f2, %f1, 0f3F800000;
	st.global.f32 	[%rd4], %f2;
$L__BB0_2:
	ret;
}
"#;

/// Loads `add_one` on the current device.
fn add_one_kernel() -> CUfunction {
    let (mut module, mut f) = (null_mut(), null_mut());
    let text = CString::new(ADD_ONE).unwrap();
    unsafe {
        assert_eq!(
            cuModuleLoadData(&mut module, text.as_ptr().cast()),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuModuleGetFunction(&mut f, module, c"add_one".as_ptr()),
            CUDA_SUCCESS
        );
    }
    f
}

fn launch_add_one(f: CUfunction, x: u64, n: i32, stream: CUstream) {
    let (mut x, mut n) = (x, n);
    let mut params = [
        (&mut x as *mut u64).cast::<c_void>(),
        (&mut n as *mut i32).cast(),
    ];
    let r = unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(r, CUDA_SUCCESS);
}

#[test]
fn collectives_run_in_stream_order_with_kernels_memsets_and_copies() {
    let _g = setup();
    let n = 2;
    let out = ranks_as_threads(n, |rank, comm| unsafe {
        let f = add_one_kernel();
        let mut stream = null_mut();
        assert_eq!(cuStreamCreate(&mut stream, 0), CUDA_SUCCESS);
        let x = upload(&bytes(&[rank as f32 * 10.0; 8]));
        let y = alloc(32);
        let z = alloc(32);
        // Before the collective: a kernel (x += 1) and a memset of x[6..8]
        // to zero bytes; after it: a copy of the result.
        launch_add_one(f, x, 8, stream);
        assert_eq!(cuMemsetD8Async(x + 24, 0, 8, stream), CUDA_SUCCESS);
        let r = ncclAllReduce(x as _, y as _, 8, F32, SUM, comm, stream);
        assert_eq!(r, NCCL_SUCCESS);
        assert_eq!(cuMemcpyDtoDAsync_v2(z, y, 32, stream), CUDA_SUCCESS);
        launch_add_one(f, y, 8, stream);
        assert_eq!(cuStreamSynchronize(stream), CUDA_SUCCESS);
        (f32s(&read(z, 32)), f32s(&read(y, 32)))
    });
    for (z, y) in out {
        assert_eq!(z, [vec![12.0f32; 6], vec![0.0; 2]].concat());
        assert_eq!(y, [vec![13.0f32; 6], vec![1.0; 2]].concat());
    }
}

#[test]
fn the_profile_records_collectives_in_enqueue_order() {
    let _g = setup();
    profile::configure(false);
    profile::reset();
    let n = 2;
    let comms = init_all(n);
    let bufs: Vec<u64> = (0..n)
        .map(|r| {
            bind(r);
            upload(&bytes(&[1.0f32; 4]))
        })
        .collect();
    group(n, |r| unsafe {
        let b = bufs[r] as *mut c_void;
        assert_eq!(
            ncclAllReduce(b, b, 4, F32, SUM, comms[r], null_mut()),
            NCCL_SUCCESS
        );
    });
    bind(0);
    let f = add_one_kernel();
    launch_add_one(f, bufs[0], 4, null_mut());
    assert_eq!(f32s(&read(bufs[0], 16)), vec![3.0; 4]);
    bind(1);
    assert_eq!(f32s(&read(bufs[1], 16)), vec![2.0; 4]);
    let p = profile::snapshot();
    let coll: Vec<usize> = p
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| **e == Event::Collective(CollectiveKind::AllReduce, 16))
        .map(|(i, _)| i)
        .collect();
    let launch = p.events.iter().position(|e| matches!(e, Event::Launch(_)));
    assert_eq!(coll.len(), 2, "{:?}", p.events);
    assert!(launch.is_some_and(|l| coll[1] < l), "{:?}", p.events);
    let c = p.counts();
    assert_eq!((c.collectives, c.collective_bytes), (2, 32));
    for c in comms {
        assert_eq!(ncclCommDestroy(c), NCCL_SUCCESS);
    }
}
