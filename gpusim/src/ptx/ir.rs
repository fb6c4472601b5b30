//! The decoded form of a module: every instruction resolved once at load
//! time into an [`Op`] whose operands are register slots (immediates and
//! special registers live in slots too, filled before execution), whose
//! branch targets are instruction indices and whose reconvergence points
//! are precomputed. Nothing is looked up by name while a kernel runs.

use super::alu::{BinFn, CmpFn, TernFn, UnFn};
use crate::numeric::{ApproxOp, CmpOp, CvtMode, CvtTy, FloatTy, Precision, Rnd};

/// A value register slot (relative to the function's register window).
pub(crate) type Slot = u32;
/// A predicate register slot (relative to the function's predicate window).
pub(crate) type PSlot = u32;

/// No reconvergence point inside the function (paths meet only at exit).
pub(crate) const NO_PC: u32 = u32::MAX;
/// No predicate destination (an optional `|p` left out).
pub(crate) const NO_PRED: PSlot = u32::MAX;
/// A register sink (`_`, or the `%temp` half of an unpacking `mov`).
pub(crate) const SINK: Slot = u32::MAX;

/// A state space of a memory instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    /// Device memory.
    Global,
    /// The block's shared memory (32-bit offsets).
    Shared,
    /// The thread's local memory (offsets in its stack of frames).
    Local,
    /// Kernel parameters (read-only) or a frame's call parameters.
    Param,
    /// Generic: decided by the address's window.
    Generic,
}

/// Base of an address operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Base {
    /// A register's value.
    Reg(Slot),
    /// None: the offset is the address (resolved symbol or literal).
    Abs,
    /// The current frame's base in local memory (params of a `.func`,
    /// call-block `.param`s, the local depot).
    Frame,
}

/// An address operand `[base+off]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Addr {
    /// The base.
    pub base: Base,
    /// Byte offset added.
    pub off: u64,
}

/// An atomic operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomOp {
    /// Integer add.
    Add,
    /// Float add (`.f16/.bf16/.f32/.f64`, round to nearest, no ftz).
    FAdd(FloatTy),
    /// Compare and swap.
    Cas,
    /// Exchange.
    Exch,
    /// Min (signedness from the type).
    Min,
    /// Max.
    Max,
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
    /// Bitwise xor.
    Xor,
    /// `inc`: `old >= b ? 0 : old + 1`.
    Inc,
    /// `dec`: `old == 0 || old > b ? b : old - 1`.
    Dec,
}

/// Float binary operations with modifiers (the general, slow path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FBin {
    /// add
    Add(Rnd),
    /// sub
    Sub(Rnd),
    /// mul
    Mul(Rnd),
    /// div
    Div(Precision),
    /// min (`nan` = `.NaN`)
    Min { nan: bool },
    /// max
    Max { nan: bool },
    /// copysign
    Copysign,
}

/// Float unary operations with modifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FUn {
    /// abs
    Abs,
    /// neg
    Neg,
    /// sqrt
    Sqrt(Precision),
    /// rcp
    Rcp(Precision),
    /// ex2, lg2, sin, cos, rsqrt, tanh (`.approx`).
    Approx(ApproxOp),
}

/// Carry-chain operations (`.cc` writes the carry flag, `c` forms read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CarryOp {
    /// add.cc / addc / addc.cc
    Add { cin: bool, cout: bool },
    /// sub.cc / subc / subc.cc (borrow in the flag)
    Sub { cin: bool, cout: bool },
    /// mad.lo.cc / madc.lo / madc.lo.cc / mad.hi.cc / madc.hi / madc.hi.cc
    Mad { hi: bool, cin: bool, cout: bool },
}

/// Vote modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VoteMode {
    /// ballot.b32
    Ballot,
    /// all.pred
    All,
    /// any.pred
    Any,
    /// uni.pred
    Uni,
}

/// Shuffle modes of `shfl.sync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShflMode {
    /// Source lane `lane - b`.
    Up,
    /// Source lane `lane + b`.
    Down,
    /// Source lane `lane ^ b`.
    Bfly,
    /// Source lane `b` within the segment.
    Idx,
}

/// Operations of `redux.sync` (32-bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduxOp {
    /// Sum, truncated to 32 bits.
    Add,
    /// Minimum (`true`: signed).
    Min(bool),
    /// Maximum (`true`: signed).
    Max(bool),
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
    /// Bitwise xor.
    Xor,
}

/// Operations on packed half pairs (`.f16x2`, `.bf16x2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PackedOp {
    /// add
    Add(Rnd),
    /// sub
    Sub(Rnd),
    /// mul
    Mul(Rnd),
    /// fma (`relu`: negative results become +0, NaN the canonical NaN)
    Fma { rnd: Rnd, relu: bool },
    /// neg
    Neg,
    /// abs
    Abs,
    /// min (`nan` = `.NaN`)
    Min { nan: bool },
    /// max
    Max { nan: bool },
}

/// Predicate combination of `setp`'s `.and/.or/.xor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BoolOp {
    /// and
    And,
    /// or
    Or,
    /// xor
    Xor,
}

/// `cp.async.{ca,cg}.shared.global [dst], [src], size{, src-size | ignore-src}`
/// (boxed in [`Op::CpAsync`]: rare, and larger than the common operations).
#[derive(Clone, Debug)]
pub(crate) struct CpAsync {
    /// Shared destination.
    pub dst: Addr,
    /// Global source.
    pub src: Addr,
    /// cp-size: 4, 8 or 16 bytes.
    pub size: u8,
    /// src-size (bytes read; the rest zero-filled), when given.
    pub src_size: Option<Slot>,
    /// ignore-src predicate (and whether it is negated), when given.
    pub ignore: Option<(PSlot, bool)>,
}

/// The element type of an `mma` multiplicand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MmaElem {
    /// `.f16`, two per register.
    F16,
    /// `.bf16`, two per register.
    Bf16,
    /// `.tf32`: an f32 register whose low 13 mantissa bits are ignored.
    Tf32,
    /// `.s8`, four per register.
    S8,
    /// `.u8`, four per register.
    U8,
}

impl MmaElem {
    /// Elements per 32-bit register.
    pub(crate) fn per_reg(self) -> usize {
        match self {
            MmaElem::Tf32 => 1,
            MmaElem::F16 | MmaElem::Bf16 => 2,
            MmaElem::S8 | MmaElem::U8 => 4,
        }
    }
}

/// The type of an `mma` accumulator (C or D).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MmaAcc {
    /// Four `.f32` registers.
    F32,
    /// Two `.f16x2` registers.
    F16,
    /// Four `.s32` registers.
    S32,
}

/// `mma.sync.aligned.m16n8kK.row.col{.satfinite}.dtype.atype.btype.ctype
/// d, a, b, c` (boxed in [`Op::Mma`]).
#[derive(Clone, Debug)]
pub(crate) struct Mma {
    /// K: 4, 8, 16 or 32.
    pub k: u8,
    /// A's element type.
    pub a_elem: MmaElem,
    /// B's element type.
    pub b_elem: MmaElem,
    /// C's type.
    pub c_ty: MmaAcc,
    /// D's type.
    pub d_ty: MmaAcc,
    /// `.satfinite` (integer: results clamped to the s32 range).
    pub sat: bool,
    /// Destination registers (2 or 4 used).
    pub d: [Slot; 4],
    /// A registers (2 or 4 used).
    pub a: [Slot; 4],
    /// B registers (1 or 2 used).
    pub b: [Slot; 2],
    /// C registers (2 or 4 used).
    pub c: [Slot; 4],
}

/// The operands of `ldmatrix.sync.aligned.m8n8.xN{.trans}{.shared}.b16
/// {r…}, [addr]` and `stmatrix.sync.aligned.m8n8.xN{.trans}{.shared}.b16
/// [addr], {r…}` (boxed in [`Op::Ldmatrix`], [`Op::Stmatrix`]).
#[derive(Clone, Debug)]
pub(crate) struct Matrix8x8 {
    /// Matrices: 1, 2 or 4.
    pub num: u8,
    /// `.trans`: each matrix is delivered transposed.
    pub trans: bool,
    /// `.shared` or generic.
    pub space: Space,
    /// The fragment registers (`num` used): ldmatrix's destinations,
    /// stmatrix's sources.
    pub d: [Slot; 4],
    /// The row address each of the first `8·num` lanes supplies.
    pub addr: Addr,
    /// Scratch slots holding the supplying lanes' rows (loaded before they
    /// are distributed, or gathered before they are stored).
    pub rows: [Slot; 4],
}

/// A call's parameter copy: bytes from the caller's frame at `from` to the
/// callee's frame at `to` (or back, for the return value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ParamCopy {
    /// Offset in the source frame.
    pub from: u32,
    /// Offset in the destination frame.
    pub to: u32,
    /// Bytes.
    pub size: u32,
}

/// A decoded instruction's operation.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// `d = a` (any width: values are canonical already).
    Mov { d: Slot, a: Slot },
    /// `mov.pred d, 0/1` (any non-zero immediate is true).
    PConst { d: PSlot, v: bool },
    /// `d = p` for predicates.
    PMov { d: PSlot, a: PSlot },
    /// Predicate logic (`and/or/xor.pred`); `not` is `Xor` with `b` = None.
    PLogic {
        op: BoolOp,
        d: PSlot,
        a: PSlot,
        b: Option<PSlot>,
        neg_b: bool,
    },
    /// `selp d, a, b, p`.
    Selp { d: Slot, a: Slot, b: Slot, p: PSlot },
    /// `mov.bN d, {s0, s1, …}`: `n` pieces of `bits` each, s0 lowest.
    Pack {
        d: Slot,
        s: [Slot; 4],
        n: u8,
        bits: u8,
    },
    /// `mov.bN {d0, d1, …}, a`.
    Unpack {
        d: [Slot; 4],
        n: u8,
        bits: u8,
        a: Slot,
    },
    /// `d = frame base + off` (`mov %SPL, __local_depot0`).
    FrameAddr { d: Slot, off: u64 },
    /// A lane-wise binary operation (integer ops and the fast float ops).
    Bin { f: BinFn, d: Slot, a: Slot, b: Slot },
    /// A lane-wise ternary operation (mad, fma, bfe, …).
    Tern {
        f: TernFn,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// A lane-wise unary operation (not, neg, cvt between ints, …).
    Un { f: UnFn, d: Slot, a: Slot },
    /// `bfi.bN d, a, b, c, e`.
    Bfi {
        bits: u8,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
        e: Slot,
    },
    /// Carry chains on 32/64-bit values.
    Carry {
        op: CarryOp,
        bits: u8,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// `setp.cmp[.bop] d[|d2], a, b[, [!]c]`.
    Setp {
        f: CmpFn,
        d: PSlot,
        d2: Option<PSlot>,
        a: Slot,
        b: Slot,
        comb: Option<(BoolOp, PSlot, bool)>,
    },
    /// `set.cmp.dtype d, a, b`: all ones (or 1.0f for `.f32`) when true.
    Set {
        f: CmpFn,
        d: Slot,
        a: Slot,
        b: Slot,
        one: u64,
    },
    /// `slct.dtype.s32/f32 d, a, b, c`: `c >= 0 ? a : b`.
    Slct {
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
        f32: bool,
    },
    /// `cvt` through [`crate::numeric::cvt`].
    Cvt {
        dst: CvtTy,
        src: CvtTy,
        mode: CvtMode,
        d: Slot,
        a: Slot,
    },
    /// A float binary op with modifiers, through [`crate::numeric`].
    FBin {
        op: FBin,
        ty: FloatTy,
        ftz: bool,
        sat: bool,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    /// `fma`/`mad` with modifiers, through [`crate::numeric::ffma`].
    Fma {
        ty: FloatTy,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// A float unary op with modifiers, through [`crate::numeric`].
    FUn {
        op: FUn,
        ty: FloatTy,
        ftz: bool,
        d: Slot,
        a: Slot,
    },
    /// Load `n` elements of `size` bytes into `d` (sign-extended to
    /// `sext_bits` when the type is signed; 0 = zero-extend).
    Ld {
        space: Space,
        size: u8,
        n: u8,
        sext_bits: u8,
        d: [Slot; 4],
        addr: Addr,
    },
    /// Store `n` elements of `size` bytes from `s`.
    St {
        space: Space,
        size: u8,
        n: u8,
        s: [Slot; 4],
        addr: Addr,
    },
    /// An atomic read-modify-write; `d` receives the old value.
    Atom {
        space: Space,
        op: AtomOp,
        size: u8,
        signed: bool,
        d: Slot,
        addr: Addr,
        b: Slot,
        c: Slot,
    },
    /// `cvta` (`to`: generic → space) for shared/local windows; global is `Mov`.
    Cvta {
        space: Space,
        to: bool,
        bits: u8,
        d: Slot,
        a: Slot,
    },
    /// Branch; `rpc` is the reconvergence point (immediate post-dominator).
    Bra { target: u32, rpc: u32 },
    /// Call of function `func` of the module.
    Call {
        func: u32,
        args: Box<[ParamCopy]>,
        ret: Option<ParamCopy>,
    },
    /// `ret`.
    Ret,
    /// `exit`.
    Exit,
    /// `trap`.
    Trap,
    /// `bar.sync` / `barrier.sync` (id ignored: one barrier per block).
    Bar,
    /// `vote.sync`.
    Vote {
        mode: VoteMode,
        d: Slot,
        pd: PSlot,
        p: PSlot,
        neg: bool,
        member: Slot,
    },
    /// `shfl.sync.mode.b32 d[|p], a, b, c, member` (`p` = [`NO_PRED`] when absent).
    Shfl {
        mode: ShflMode,
        d: Slot,
        p: PSlot,
        a: Slot,
        b: Slot,
        c: Slot,
        member: Slot,
    },
    /// `redux.sync.op.type d, a, member`.
    Redux {
        op: ReduxOp,
        d: Slot,
        a: Slot,
        member: Slot,
    },
    /// `match.any/all.sync.type d[|p], a, member` (b32 or b64).
    Match {
        all: bool,
        d: Slot,
        p: PSlot,
        a: Slot,
        member: Slot,
    },
    /// A packed half-pair operation: the scalar operation of `ty` on each
    /// 16-bit half (`c` only for fma).
    Packed {
        op: PackedOp,
        ty: FloatTy,
        ftz: bool,
        sat: bool,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// `set.cmp.dtype.f16x2` / `setp.cmp.f16x2`: each half compared; `one`
    /// is a true half's value (`set`), or the two halves set predicates
    /// `p` (low) and `q` (high, [`NO_PRED`] when absent).
    CmpPair {
        op: CmpOp,
        ty: FloatTy,
        ftz: bool,
        one: u16,
        d: Slot,
        p: PSlot,
        q: PSlot,
        a: Slot,
        b: Slot,
    },
    /// A call of `__assertfail(message, file, line, function, charSize)`:
    /// the frame offsets of the five arguments.
    AssertFail { args: [u32; 5] },
    /// `bar.warp.sync member` (`__syncwarp`): only the synccheck.
    WarpSync { member: Slot },
    /// `activemask.b32 d`.
    ActiveMask { d: Slot },
    /// `cp.async` (see [`CpAsync`]).
    CpAsync(Box<CpAsync>),
    /// `cp.async.commit_group`.
    CpAsyncCommit,
    /// `cp.async.wait_group n`, or `cp.async.wait_all` (`all`: commit first,
    /// then wait for every group).
    CpAsyncWait { n: u32, all: bool },
    /// `mma.sync` (see [`Mma`]).
    Mma(Box<Mma>),
    /// `ldmatrix.sync` (see [`Matrix8x8`]).
    Ldmatrix(Box<Matrix8x8>),
    /// `stmatrix.sync` (see [`Matrix8x8`]).
    Stmatrix(Box<Matrix8x8>),
    /// No effect (`membar`, …).
    Nop,
}

/// One decoded instruction.
#[derive(Clone, Debug)]
pub(crate) struct Inst {
    /// The operation.
    pub op: Op,
    /// Guard predicate slot (or `None`), and whether it is negated.
    pub guard: Option<(PSlot, bool)>,
}

/// What fills a slot before a function runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotInit {
    /// The same value in every lane.
    Const(u64),
    /// A special register.
    Special(Special),
}

/// Special registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Special {
    /// %tid.{x,y,z}
    Tid(u8),
    /// %ntid.{x,y,z}
    Ntid(u8),
    /// %ctaid.{x,y,z}
    Ctaid(u8),
    /// %nctaid.{x,y,z}
    Nctaid(u8),
    /// %laneid
    LaneId,
    /// %warpid
    WarpId,
    /// %nwarpid
    NWarpId,
    /// %warpsize (WARP_SZ)
    WarpSize,
}

/// A decoded function (`.entry` or `.func`).
#[derive(Clone, Debug)]
pub(crate) struct Func {
    /// Name.
    pub name: String,
    /// Kernel entry point.
    pub is_entry: bool,
    /// First instruction (index into the module's code).
    pub start: u32,
    /// Value slots of its register window.
    pub nslots: u32,
    /// Predicate slots.
    pub npreds: u32,
    /// Slots filled before it runs.
    pub init: Vec<(Slot, SlotInit)>,
    /// Bytes of its frame in local memory (params, return value, call-block
    /// params, depot).
    pub frame_bytes: u32,
    /// Kernel parameters (`.entry`): offset in the parameter buffer, spec.
    pub kparams: Vec<(u32, super::ParamSpec)>,
    /// Bytes of kernel parameters.
    pub kparam_bytes: u32,
    /// `.shared` variables: name, offset, size.
    pub shared: Vec<(String, u32, u32)>,
    /// Bytes of static shared memory.
    pub shared_bytes: u32,
    /// Names of the `.extern .shared` (dynamic) arrays, all at
    /// `dyn_shared_base`.
    pub dyn_shared: Vec<String>,
    /// Offset of dynamic shared memory (after the static variables).
    pub dyn_shared_base: u32,
}

/// Per-instruction source information, for faults.
#[derive(Clone, Debug)]
pub(crate) struct SrcInfo {
    /// 1-based PTX line.
    pub line: u32,
    /// The statement's text.
    pub text: String,
}
