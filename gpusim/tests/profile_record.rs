//! The profile of a run (`GPUSIM_PROFILE`): a kernel's counters (instruction
//! classes, FLOPs, global requests, sectors per request, distinct sectors),
//! a GEMM's shape, and the order of allocations, copies, launches, GEMMs and
//! synchronisations; `cuProfilerStart`/`Stop` ranges; the JSON round trip
//! and the summary table.

use leangrad_gpusim::cublas::*;
use leangrad_gpusim::driver::api_device::*;
use leangrad_gpusim::driver::api_memory::*;
use leangrad_gpusim::driver::api_module::*;
use leangrad_gpusim::driver::consts::*;
use leangrad_gpusim::profile::{
    self, model, Event, GemmCompute, GemmType, InstClass, Profile, SyncKind,
};
use std::ffi::{c_void, CString};
use std::ptr::null_mut;

/// `add_one(float* x, int n)`: x[i] += 1 for i < n (NVRTC 13 output).
const PTX: &str = r#"
.version 9.0
.target sm_80
.address_size 64
.visible .entry add_one(
	.param .u64 add_one_param_0,
	.param .u32 add_one_param_1,
	.param .u32 add_one_param_2
)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<3>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<5>;
	ld.param.u64 	%rd1, [add_one_param_0];
	ld.param.u32 	%r2, [add_one_param_1];
	ld.param.u32 	%r6, [add_one_param_2];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	mul.lo.s32 	%r7, %r1, %r6;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.s32 	%rd3, %r7, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.global.f32 	%f1, [%rd4];
	add.rn.f32 	%f2, %f1, 0f3F800000;
	st.global.f32 	[%rd4], %f2;
$L__BB0_2:
	ret;
}
"#;

fn check(r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS);
}

/// Launches `add_one` over `n` elements `stride` floats apart.
fn add_one(f: CUfunction, x: u64, n: i32, stride: i32) {
    let (mut x, mut n, mut s) = (x, n, stride);
    let mut params = [
        (&mut x as *mut u64).cast::<c_void>(),
        (&mut n as *mut i32).cast(),
        (&mut s as *mut i32).cast(),
    ];
    let blocks = (n as u32).div_ceil(256);
    check(unsafe {
        cuLaunchKernel(
            f,
            blocks,
            1,
            1,
            256,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        )
    });
}

fn setup() -> (CUfunction, CublasHandle) {
    let (mut module, mut f, mut h) = (null_mut(), null_mut(), null_mut());
    unsafe {
        check(cuInit(0));
        let mut ctx = null_mut();
        check(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        check(cuCtxSetCurrent(ctx));
        let text = CString::new(PTX).unwrap();
        check(cuModuleLoadData(&mut module, text.as_ptr().cast()));
        check(cuModuleGetFunction(&mut f, module, c"add_one".as_ptr()));
        assert_eq!(cublasCreate_v2(&mut h), CUBLAS_STATUS_SUCCESS);
    }
    (f, h)
}

fn alloc_with(bytes: &[u8]) -> u64 {
    let mut p = 0;
    unsafe {
        check(cuMemAllocAsync(&mut p, bytes.len(), null_mut()));
        check(cuMemcpyHtoDAsync_v2(
            p,
            bytes.as_ptr().cast(),
            bytes.len(),
            null_mut(),
        ));
    }
    p
}

fn gemm(h: CublasHandle, (m, n, k): (i32, i32, i32), a: u64, b: u64, c: u64) {
    let (alpha, beta) = (1f32, 0f32);
    let r = unsafe {
        cublasGemmEx(
            h,
            0,
            1,
            m,
            n,
            k,
            (&alpha as *const f32).cast(),
            a as *const c_void,
            0,
            m,
            b as *const c_void,
            0,
            n,
            (&beta as *const f32).cast(),
            c as *mut c_void,
            0,
            m,
            77,
            -1,
        )
    };
    assert_eq!(r, CUBLAS_STATUS_SUCCESS);
}

#[test]
fn a_run_is_recorded_in_order_with_its_counters() {
    let (f, h) = setup();
    profile::configure(false);
    profile::reset();
    let n = 1024usize;
    let x = alloc_with(&vec![0u8; 4 * 32 * n]);
    // Coalesced: consecutive floats. Strided: 32 floats (128 bytes) apart.
    add_one(f, x, n as i32, 1);
    add_one(f, x, n as i32, 32);
    let (a, b, c) = (
        alloc_with(&vec![0u8; 4 * 64 * 16]),
        alloc_with(&vec![0u8; 4 * 32 * 16]),
        alloc_with(&vec![0u8; 4 * 64 * 32]),
    );
    gemm(h, (64, 32, 16), a, b, c);
    let mut back = vec![0u8; 16];
    unsafe {
        check(cuMemcpyDtoHAsync_v2(
            back.as_mut_ptr().cast(),
            x,
            16,
            null_mut(),
        ));
        check(cuMemFreeAsync(c, null_mut()));
        check(cuStreamSynchronize(null_mut()));
    }
    // x[0] is in both launches.
    assert_eq!(&back[..4], &2f32.to_le_bytes());
    let p = profile::snapshot();
    let kinds: Vec<&str> = p
        .events
        .iter()
        .map(|e| match e {
            Event::Alloc(_) => "alloc",
            Event::HtoD(_) => "h2d",
            Event::Launch(_) => "launch",
            Event::Gemm(_) => "gemm",
            Event::DtoH(_) => "d2h",
            Event::Free(_) => "free",
            Event::Sync(_) => "sync",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "alloc", "h2d", "launch", "launch", "alloc", "h2d", "alloc", "h2d", "alloc", "h2d",
            "gemm", "d2h", "free", "sync"
        ]
    );
    assert_eq!(p.events[0], Event::Alloc(4 * 32 * n as u64));
    assert_eq!(p.events[12], Event::Free(4 * 64 * 32));
    assert_eq!(p.events[13], Event::Sync(SyncKind::Stream));
    let counts = p.counts();
    assert_eq!(
        (counts.launches, counts.cublas_calls, counts.syncs),
        (2, 1, 1)
    );
    assert_eq!((counts.h2d, counts.d2h, counts.d2h_bytes), (4, 1, 16));
    assert_eq!(p.kernels, ["add_one"]);

    let launch = |i: usize| match p.events[i] {
        Event::Launch(l) => &p.launches[l as usize],
        e => panic!("{e:?}"),
    };
    let (coalesced, strided) = (&launch(2).counters, &launch(3).counters);
    let warps = n as u64 / 32;
    // 17 instructions per thread, every lane active.
    assert_eq!(coalesced.total_thread_instructions(), 17 * n as u64);
    assert_eq!(coalesced.total_warp_instructions(), 17 * warps);
    let per_thread = |class: InstClass| coalesced.thread_instructions[class.index()] / n as u64;
    assert_eq!(per_thread(InstClass::Control), 5); // 3 ld.param, bra, ret
    assert_eq!(per_thread(InstClass::Int), 8);
    assert_eq!(per_thread(InstClass::Convert), 1);
    assert_eq!(per_thread(InstClass::Global), 2);
    assert_eq!(per_thread(InstClass::F32), 1);
    assert_eq!(coalesced.flops[InstClass::F32.index()], n as u64);
    assert_eq!(coalesced.global_load_requests, warps);
    assert_eq!(coalesced.global_store_requests, warps);
    // 4 sectors per request, each sector loaded and stored: 4 KiB touched.
    assert_eq!(coalesced.global_sectors, 2 * 4 * warps);
    assert_eq!(coalesced.unique_sectors, 4 * n as u64 / 32);
    // One sector per lane when lanes are 128 bytes apart.
    assert_eq!(strided.global_sectors, 2 * 32 * warps);
    assert_eq!(strided.unique_sectors, n as u64);
    assert_eq!(launch(2).grid, [4, 1, 1]);
    assert_eq!(launch(2).block, [256, 1, 1]);

    let g = &p.gemms[0];
    assert_eq!((g.m, g.n, g.k, g.batch), (64, 32, 16, 1));
    assert_eq!((g.transa, g.transb), (false, true));
    assert_eq!(
        (g.ab_type, g.c_type, g.compute),
        (GemmType::F32, GemmType::F32, GemmCompute::Tf32)
    );
    assert_eq!(g.ld, [64, 32, 64]);
    assert_eq!(g.entry, "cublasGemmEx");

    // The file's JSON reads back as the same profile.
    let back = Profile::from_json(&p.to_json()).expect("a profile");
    assert_eq!(back, p);
    assert!(Profile::from_json(
        "{\"format\":\"other\",\"kernels\":[],\"launches\":[],\"gemms\":[],\"events\":[]}"
    )
    .is_err());

    // The model: the strided launch moves 8× the bytes, never less time.
    let (t_coalesced, _) = model::launch_us(launch(2), &model::H200, &model::COSTS);
    let (t_strided, _) = model::launch_us(launch(3), &model::H200, &model::COSTS);
    assert!(t_strided >= t_coalesced);
    let pred = model::predict(&p, &model::H200);
    assert!(pred.total_us > pred.kernels_us + pred.gemms_us);
    let table = profile::table::summary(&p, &model::H200);
    assert!(
        table.contains("add_one") && table.contains("cublasGemmEx"),
        "{table}"
    );
    assert!(
        table.contains("2 launches, 1 cuBLAS calls, 1 syncs"),
        "{table}"
    );

    // With ranges from the profiler API, only what is inside is recorded.
    profile::configure(true);
    profile::reset();
    add_one(f, x, 32, 1);
    check(cuProfilerStart());
    add_one(f, x, 64, 1);
    check(cuProfilerStop());
    add_one(f, x, 96, 1);
    check(cuCtxSynchronize());
    let p = profile::snapshot();
    assert_eq!(p.events.len(), 1, "{:?}", p.events);
    match p.events[0] {
        Event::Launch(l) => assert_eq!(p.launches[l as usize].counters.global_load_requests, 2),
        e => panic!("{e:?}"),
    }
}
