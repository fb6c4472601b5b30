//! PyTorch `.pth` files (`leangrad::io::load_pth`, `load_weights`) against
//! what PyTorch itself saved (fixtures written by
//! `python-compare/pth_fixture.py`): every tensor bit for bit, the refusal
//! of pickles that would run code (and that nothing ran), damaged archives
//! and pickles, and seeded random mutations that must give `Ok` or `Err`,
//! never a panic.

use leangrad::io::{load_pth, load_pth_bytes, load_safetensors, load_weights, load_weights_bytes};
use leangrad::{DType, Error, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fx(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pth")
        .join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fx(name)).unwrap()
}

/// The tensor's elements as bit patterns, so that NaNs and signed zeros
/// compare exactly.
fn bits(t: &Tensor) -> Vec<u64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits().into())
            .collect(),
        DType::F64 => t
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        DType::F16 => t
            .to_vec::<half::f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits().into())
            .collect(),
        DType::BF16 => t
            .to_vec::<half::bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits().into())
            .collect(),
        DType::U8 => t
            .to_vec::<u8>()
            .unwrap()
            .iter()
            .map(|&v| v.into())
            .collect(),
        DType::U32 => t
            .to_vec::<u32>()
            .unwrap()
            .iter()
            .map(|&v| v.into())
            .collect(),
        DType::I64 => t
            .to_vec::<i64>()
            .unwrap()
            .iter()
            .map(|&v| v as u64)
            .collect(),
    }
}

fn assert_same(what: &str, got: &BTreeMap<String, Tensor>, want: &BTreeMap<String, Tensor>) {
    let names = |m: &BTreeMap<String, Tensor>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{what}: names");
    for (name, w) in want {
        let g = &got[name];
        assert_eq!(g.dtype(), w.dtype(), "{what}: {name} dtype");
        assert_eq!(g.shape(), w.shape(), "{what}: {name} shape");
        assert_eq!(bits(g), bits(w), "{what}: {name} values");
    }
}

fn expected(name: &str) -> BTreeMap<String, Tensor> {
    load_safetensors(fx(&format!("{name}.expected.safetensors"))).unwrap()
}

#[test]
fn state_dicts_load_bit_for_bit() {
    for name in [
        "tiny_f32",
        "tiny_f16",
        "tiny_bf16",
        "tiny_f64",
        "views",
        "ints",
        "parameters",
        "checkpoint",
        "other_top",
    ] {
        let got = load_pth(fx(&format!("{name}.pth"))).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_same(name, &got, &expected(name));
    }
    // Re-zipped with deflate: the same tensors.
    assert_same(
        "deflated",
        &load_pth(fx("deflated.pth")).unwrap(),
        &expected("tiny_f32"),
    );
}

#[test]
fn dtypes_shapes_and_views_are_pytorchs() {
    let sd = load_pth(fx("tiny_f32.pth")).unwrap();
    let nbt = &sd["1.num_batches_tracked"];
    assert_eq!((nbt.dtype(), nbt.shape()), (DType::I64, &[][..]));
    assert_eq!(nbt.to_vec::<i64>().unwrap(), [1]);
    assert_eq!(sd["0.weight"].shape(), &[3, 2, 3, 3]);
    assert_eq!(sd["4.weight"].dtype(), DType::F32);
    assert_eq!(
        load_pth(fx("tiny_bf16.pth")).unwrap()["4.bias"].dtype(),
        DType::BF16
    );

    let v = load_pth(fx("views.pth")).unwrap();
    let base = v["base"].to_vec::<f32>().unwrap();
    let t = v["transposed"].to_vec::<f32>().unwrap();
    assert_eq!(v["transposed"].shape(), &[4, 3]);
    for i in 0..4 {
        for j in 0..3 {
            assert_eq!(t[i * 3 + j].to_bits(), base[j * 4 + i].to_bits());
        }
    }
    assert_eq!(v["row"].to_vec::<f32>().unwrap(), base[4..8]);
    assert_eq!(v["broadcast"].shape(), &[2, 4]);
    assert_eq!(v["scalar"].to_vec::<f32>().unwrap(), [2.5]);
    assert_eq!(v["empty"].shape(), &[0, 3]);

    let i = load_pth(fx("ints.pth")).unwrap();
    assert_eq!(i["bool"].to_vec::<u8>().unwrap(), [1, 0, 1]);
    assert_eq!(
        i["int32"].to_vec::<i64>().unwrap(),
        [-(1 << 31), 2, (1 << 31) - 1]
    );
    assert_eq!(i["int8"].dtype(), DType::I64);
    assert_eq!(i["uint16"].to_vec::<u32>().unwrap(), [0, 1, 65535]);
    assert_eq!(i["uint32_t"].to_vec::<u32>().unwrap(), [1, 3, 2, 4]);
}

#[test]
fn load_weights_tells_the_formats_apart_by_their_bytes() {
    let pth = load_pth(fx("tiny_f32.pth")).unwrap();
    assert_same(
        "load_weights(.pth)",
        &load_weights(fx("tiny_f32.pth")).unwrap(),
        &pth,
    );
    let st = fx("tiny_f32.expected.safetensors");
    assert_same(
        "load_weights(.safetensors)",
        &load_weights(&st).unwrap(),
        &pth,
    );
    // The name does not matter, the contents do.
    let dir = std::env::temp_dir().join(format!("leangrad-io-pth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let renamed = dir.join("weights.safetensors");
    std::fs::copy(fx("tiny_f32.pth"), &renamed).unwrap();
    assert_same("renamed", &load_weights(&renamed).unwrap(), &pth);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_same(
        "bytes",
        &load_weights_bytes(&read("tiny_f32.pth")).unwrap(),
        &pth,
    );
    assert_same(
        "st bytes",
        &load_weights_bytes(&std::fs::read(&st).unwrap()).unwrap(),
        &pth,
    );
    assert_same(
        "pth bytes",
        &load_pth_bytes(&read("tiny_f32.pth")).unwrap(),
        &pth,
    );
    match load_weights(fx("no-such-file.pth")) {
        Err(Error::File { path, .. }) => assert!(path.ends_with("no-such-file.pth")),
        other => panic!("{other:?}"),
    }
}

/// The error's reason (a `MalformedWeights`), or a panic naming what came.
fn reason(r: leangrad::Result<BTreeMap<String, Tensor>>) -> (Option<String>, String) {
    match r {
        Err(Error::MalformedWeights { tensor, reason, .. }) => (tensor, reason),
        Err(other) => panic!("not MalformedWeights: {other}"),
        Ok(m) => panic!("loaded {:?}", m.keys().collect::<Vec<_>>()),
    }
}

#[test]
fn pickles_that_would_run_code_are_refused_and_nothing_runs() {
    for (file, global, marker) in [
        ("evil_os_system.pth", "os.system", "os-system"),
        ("evil_builtins_eval.pth", "builtins.eval", "eval"),
        ("evil_posix_system.pth", "posix.system", "posix-system"),
    ] {
        let marker = PathBuf::from(format!("/tmp/leangrad-pth-pwned-{marker}"));
        let _ = std::fs::remove_file(&marker);
        for r in [
            load_pth(fx(file)),
            load_weights(fx(file)),
            load_pth_bytes(&read(file)),
        ] {
            let (_, why) = reason(r);
            assert!(why.contains(&format!("`{global}`")), "{file}: {why}");
            assert!(why.contains("nothing in the file was run"), "{file}: {why}");
        }
        assert!(!marker.exists(), "{file}: {} was created", marker.display());
    }
}

#[test]
fn other_objects_are_refused_by_name() {
    let (_, why) = reason(load_pth(fx("whole_module.pth")));
    assert!(why.contains("`torch.nn.modules.linear.Linear`"), "{why}");
    let (_, why) = reason(load_pth(fx("torchscript.pt")));
    assert!(why.contains("TorchScript"), "{why}");
    let (_, why) = reason(load_pth(fx("list.pth")));
    assert!(why.contains("holds a list"), "{why}");
    let (_, why) = reason(load_pth(fx("two_state_dicts.pth")));
    assert!(why.contains("`model`") && why.contains("`ema`"), "{why}");
    let (_, why) = reason(load_weights(fx("legacy.pt")));
    assert!(
        why.contains("legacy format") && why.contains("re-save"),
        "{why}"
    );
    let (_, why) = reason(load_pth(fx("big_endian.pth")));
    assert!(why.contains("big-endian"), "{why}");
    let (_, why) = reason(load_pth(fx("tiny_f32.expected.safetensors")));
    assert!(why.contains("not a PyTorch file"), "{why}");
    // The safetensors reader points at the loader that reads .pth files.
    let (_, why) = reason(load_safetensors(fx("tiny_f32.pth")));
    assert!(why.contains("load_weights"), "{why}");
    for (file, dtype, tensor) in [
        ("complex.pth", "torch.complex64", "z"),
        ("uint64.pth", "torch.uint64", "big"),
    ] {
        match load_pth(fx(file)) {
            Err(Error::UnsupportedWeightDType {
                tensor: t,
                dtype: d,
            }) => {
                assert_eq!((t.as_str(), d.as_str()), (tensor, dtype))
            }
            other => panic!("{file}: {other:?}"),
        }
    }
}

#[test]
fn views_outside_their_storage_are_refused() {
    for (file, words) in [
        (
            "huge_numel.pth",
            "holds 16 bytes, but the pickle declares 1000000000000000 elements",
        ),
        (
            "short_storage.pth",
            "holds 16 bytes, but the pickle declares 8 elements",
        ),
        (
            "view_past_end.pth",
            "needs 5 elements of 4 bytes, but its storage holds 16 bytes",
        ),
        (
            "stride_past_end.pth",
            "needs 6 elements of 4 bytes, but its storage holds 16 bytes",
        ),
        ("negative_stride.pth", "stride -1 is negative"),
        ("overflow_shape.pth", "overflows"),
        (
            "missing_storage.pth",
            "`archive/data/7` is not in the archive",
        ),
    ] {
        let (tensor, why) = reason(load_pth(fx(file)));
        assert_eq!(tensor.as_deref(), Some("t"), "{file}: {why}");
        assert!(why.contains(words), "{file}: {why}");
    }
}

// ---- Archives built here: a zip writer and reader of stored entries ----

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A zip archive of `entries`, stored, as `torch.save` lays it out.
fn write_zip(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in entries {
        let (offset, crc, len) = (out.len() as u32, crc32(data), data.len() as u32);
        let common = |v: &mut Vec<u8>| {
            v.extend(0u16.to_le_bytes()); // flags
            v.extend(0u16.to_le_bytes()); // method: stored
            v.extend(0u32.to_le_bytes()); // time and date
            v.extend(crc.to_le_bytes());
            v.extend(len.to_le_bytes());
            v.extend(len.to_le_bytes());
            v.extend((name.len() as u16).to_le_bytes());
            v.extend(0u16.to_le_bytes()); // extra
        };
        out.extend(0x0403_4b50u32.to_le_bytes());
        out.extend(20u16.to_le_bytes());
        common(&mut out);
        out.extend(name.as_bytes());
        out.extend(data);
        central.extend(0x0201_4b50u32.to_le_bytes());
        central.extend([20, 0, 20, 0]);
        common(&mut central);
        central.extend([0; 6]); // comment length, disk, internal attributes
        central.extend(0u32.to_le_bytes()); // external attributes
        central.extend(offset.to_le_bytes());
        central.extend(name.as_bytes());
    }
    let (cd_at, cd_len, n) = (out.len() as u32, central.len() as u32, entries.len() as u16);
    out.extend(central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0; 4]);
    out.extend(n.to_le_bytes());
    out.extend(n.to_le_bytes());
    out.extend(cd_len.to_le_bytes());
    out.extend(cd_at.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

fn u16_at(b: &[u8], i: usize) -> usize {
    u16::from_le_bytes([b[i], b[i + 1]]).into()
}

fn u32_at(b: &[u8], i: usize) -> usize {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize
}

/// The entries of a stored zip without a comment (the fixtures).
fn read_zip(z: &[u8]) -> Vec<(String, Vec<u8>)> {
    let eocd = z.len() - 22;
    let (n, mut at) = (u16_at(z, eocd + 10), u32_at(z, eocd + 16));
    let mut out = Vec::new();
    for _ in 0..n {
        let (size, name_len) = (u32_at(z, at + 20), u16_at(z, at + 28));
        let next = at + 46 + name_len + u16_at(z, at + 30) + u16_at(z, at + 32);
        let name = String::from_utf8(z[at + 46..at + 46 + name_len].to_vec()).unwrap();
        let local = u32_at(z, at + 42);
        let data_at = local + 30 + u16_at(z, local + 26) + u16_at(z, local + 28);
        out.push((name, z[data_at..data_at + size].to_vec()));
        at = next;
    }
    out
}

/// A torch.save-like archive whose data.pkl is `pickle` (no storages).
fn archive_of(pickle: &[u8]) -> Vec<u8> {
    write_zip(&[
        ("archive/data.pkl".into(), pickle.to_vec()),
        ("archive/byteorder".into(), b"little".to_vec()),
    ])
}

fn pickle_error(pickle: &[u8]) -> String {
    reason(load_pth_bytes(&archive_of(pickle))).1
}

#[test]
fn the_test_zip_writer_makes_what_the_loader_reads() {
    // Rewritten by this file's writer, the fixtures still load the same:
    // the mutation test below depends on it.
    for name in ["tiny_f32", "views", "ints"] {
        let rezipped = write_zip(&read_zip(&read(&format!("{name}.pth"))));
        assert_same(name, &load_pth_bytes(&rezipped).unwrap(), &expected(name));
    }
    let empty = load_pth_bytes(&archive_of(b"\x80\x02}.")).unwrap();
    assert!(empty.is_empty());
}

#[test]
fn hostile_pickles_are_bounded() {
    let deep_tuples = [
        b"\x80\x02".to_vec(),
        vec![b'('; 100_000],
        vec![b't'; 100_000],
        b".".to_vec(),
    ]
    .concat();
    assert!(pickle_error(&deep_tuples).contains("deeper than 64"));
    let deep_lists = [
        b"\x80\x02".to_vec(),
        vec![b']'; 100_000],
        vec![b'a'; 99_999],
        b".".to_vec(),
    ]
    .concat();
    assert!(pickle_error(&deep_lists).contains("deeper than 64"));
    // A list put inside itself (a cycle).
    assert!(pickle_error(b"\x80\x02]q\x00h\x00a.").contains("recursive"));
    // A dict changed after it was nested.
    assert!(pickle_error(b"\x80\x02}q\x00]q\x01h\x00a0K\x01K\x02s.").contains("recursive"));
    let flood = [
        b"\x80\x02".to_vec(),
        vec![b'N'; (1 << 20) + 1],
        b".".to_vec(),
    ]
    .concat();
    assert!(pickle_error(&flood).contains("values on the stack"));
    let marks = [
        b"\x80\x02".to_vec(),
        vec![b'('; (1 << 20) + 1],
        b".".to_vec(),
    ]
    .concat();
    assert!(pickle_error(&marks).contains("marks"));
    // Sizes beyond the pickle's end, before any allocation.
    assert!(pickle_error(b"\x80\x04\x8d\x00\x00\x00\x00\x00\x80\x8d\x38.").contains("remain"));
    assert!(pickle_error(b"\x80\x02\x8b\xff\xff\xff\x7f.").contains("remain"));
    assert!(
        pickle_error(b"\x80\x02\x8a\x0a\x01\x00\x00\x00\x00\x00\x00\x00\x00\x01.")
            .contains("64 bits")
    );
    assert!(pickle_error(b"\x80\x02h\x05.").contains("memo entry 5"));
    assert!(pickle_error(b"\x80\x02}").contains("truncated"));
    assert!(pickle_error(b"\x80\x02t.").contains("no mark"));
    assert!(pickle_error(b"\x80\x02(R.").contains("empty stack"));
    assert!(pickle_error(b"\x80\x06}.").contains("protocol 6"));
    assert!(pickle_error(b"\x80\x02ctorch\nload\nq\x00.").contains("`torch.load`"));
    assert!(pickle_error(b"\x80\x02c__builtin__\nexec\n.").contains("`__builtin__.exec`"));
    // A known global called with what it does not take, or a non-callable.
    assert!(
        pickle_error(b"\x80\x02ccollections\nOrderedDict\nK\x01\x85R.").contains("does not take")
    );
    assert!(pickle_error(b"\x80\x02K\x01)R.").contains("calls an int"));
    assert!(pickle_error(b"\x80\x02\x8f.").contains("set"));
}

/// `{"t": _rebuild_tensor_v2(storage of one f32 = 1.5, 0, (size,), (stride,), False, OrderedDict())}`
/// in an archive, as torch.save writes it.
fn one_element_broadcast(size: i32, stride: i32) -> Vec<u8> {
    let pickle = [
        &b"\x80\x02}X\x01\x00\x00\x00tctorch._utils\n_rebuild_tensor_v2\n("[..],
        b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQ",
        b"K\x00J",
        &size.to_le_bytes(),
        b"\x85J",
        &stride.to_le_bytes(),
        b"\x85\x89ccollections\nOrderedDict\n)RtRs.",
    ]
    .concat();
    write_zip(&[
        ("archive/data.pkl".into(), pickle),
        ("archive/data/0".into(), 1.5f32.to_le_bytes().to_vec()),
    ])
}

#[test]
fn broadcast_views_load_within_a_bound() {
    let t = &load_pth_bytes(&one_element_broadcast(1000, 0)).unwrap()["t"];
    assert_eq!(t.shape(), &[1000]);
    assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.5));
    // 256 MiB from a file of a few hundred bytes: refused before allocating.
    let (tensor, why) = reason(load_pth_bytes(&one_element_broadcast(1 << 26, 0)));
    assert_eq!(tensor.as_deref(), Some("t"));
    assert!(why.contains("repeat their storages' elements"), "{why}");
    // Stride 1 over one element: outside the storage.
    let (_, why) = reason(load_pth_bytes(&one_element_broadcast(2, 1)));
    assert!(why.contains("needs 2 elements of 4 bytes"), "{why}");
}

#[test]
fn damaged_archives_are_refused() {
    let good = read("tiny_f32.pth");
    // Every truncation.
    for len in 0..good.len() {
        assert!(
            load_pth_bytes(&good[..len]).is_err(),
            "truncated to {len} loaded"
        );
    }
    let eocd = good.len() - 22;
    let set32 = |at: usize, v: u32| {
        let mut b = good.clone();
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        b
    };
    let cd = u32::from_le_bytes(good[eocd + 16..eocd + 20].try_into().unwrap()) as usize;
    for (bytes, words) in [
        (set32(eocd + 16, good.len() as u32 + 100), "past the end"),
        (set32(eocd + 12, u32::MAX - 1), "past the end"),
        (set32(cd + 42, good.len() as u32 - 10), "past the end"),
        (set32(cd + 42, 7), "local header is damaged"),
        (set32(cd + 16, 0xdead_beef), "CRC-32"),
    ] {
        let (_, why) = reason(load_pth_bytes(&bytes));
        assert!(why.contains(words), "{words}: {why}");
    }
    // torch.save writes zip64 end records too: with the classic record
    // saying "see zip64", the archive opens from the zip64 record.
    let zip64 = set32(eocd + 16, u32::MAX);
    assert_same(
        "zip64",
        &load_pth_bytes(&zip64).unwrap(),
        &expected("tiny_f32"),
    );
    let rec = u64::from_le_bytes(good[eocd - 12..eocd - 4].try_into().unwrap()) as usize;
    let mut bad = zip64.clone();
    bad[rec + 48..rec + 56].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let (_, why) = reason(load_pth_bytes(&bad));
    assert!(why.contains("past the end"), "{why}");
    let mut bad = zip64.clone();
    bad[eocd - 20] ^= 0xff;
    let (_, why) = reason(load_pth_bytes(&bad));
    assert!(why.contains("zip64 locator"), "{why}");
}

/// xorshift64*: a seeded stream for the mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// 1 to 4 random bytes of `b` overwritten or bit-flipped.
    fn mutate(&mut self, b: &mut [u8]) {
        for _ in 0..1 + self.below(4) {
            let i = self.below(b.len());
            b[i] = if self.next() & 1 == 0 {
                self.next() as u8
            } else {
                b[i] ^ (1 << self.below(8))
            };
        }
    }
}

#[test]
fn thousands_of_mutations_never_panic() {
    let mut rng = Rng(0x5eed_1e47_9a4d_0001);
    let started = std::time::Instant::now();
    let (mut tried, mut loaded) = (0usize, 0usize);
    for name in ["tiny_f32", "views", "ints", "parameters", "checkpoint"] {
        let file = read(&format!("{name}.pth"));
        let entries = read_zip(&file);
        let pkl = entries
            .iter()
            .position(|(n, _)| n.ends_with("/data.pkl"))
            .unwrap();
        for round in 0..1200 {
            let bytes = if round % 2 == 0 {
                // The archive itself (mostly caught by its structure or CRCs).
                let mut b = file.clone();
                rng.mutate(&mut b);
                b
            } else {
                // The pickle, re-zipped with valid CRCs: the unpickler and the
                // view checks see every mutation.
                let mut e = entries.clone();
                rng.mutate(&mut e[pkl].1);
                write_zip(&e)
            };
            tried += 1;
            loaded += usize::from(load_pth_bytes(&bytes).is_ok());
        }
    }
    eprintln!(
        "{tried} mutated files: {loaded} loaded, {} refused, 0 panicked, in {:.2?}",
        tried - loaded,
        started.elapsed()
    );
    assert_eq!(tried, 6000);
    assert!(
        tried - loaded > tried / 2,
        "most mutations should be refused"
    );
}

/// A torchvision ResNet-18 saved by `torch.save(model.state_dict())`
/// (`python3 python-compare/pth_fixture.py --resnet18 DIR`, 45 MB, not
/// committed): it loads in one call with the same names and bits as the
/// safetensors copy, and leangrad's logits match PyTorch's.
#[test]
#[ignore = "needs LEANGRAD_PTH_RESNET18=DIR from `python3 python-compare/pth_fixture.py --resnet18 DIR`"]
fn torchvision_resnet18_pth_matches_pytorch() {
    use leangrad::io::{load_state_dict, LoadOptions};
    use leangrad::models::{ResNet, ResNetConfig};
    use leangrad::nn::Module;

    let dir = PathBuf::from(
        std::env::var("LEANGRAD_PTH_RESNET18").expect("set LEANGRAD_PTH_RESNET18=DIR"),
    );
    let t = std::time::Instant::now();
    let sd = load_weights(dir.join("resnet18.pth")).unwrap();
    eprintln!(
        "loaded {} tensors from resnet18.pth in {:.2?}",
        sd.len(),
        t.elapsed()
    );
    assert_same(
        "resnet18",
        &sd,
        &load_safetensors(dir.join("resnet18.safetensors")).unwrap(),
    );

    let mut model = ResNet::new(
        ResNetConfig::resnet18(1000),
        DType::F32,
        leangrad::Device::Cpu,
        0,
    )
    .unwrap();
    let report = load_state_dict(&model, &sd, LoadOptions::default()).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty());
    model.set_training(false);
    let io = load_safetensors(dir.join("resnet18_io.safetensors")).unwrap();
    let _no_grad = leangrad::autograd::no_grad();
    let logits = model.forward(&io["input"]).unwrap();
    let (got, want) = (
        logits.to_vec::<f32>().unwrap(),
        io["logits"].to_vec::<f32>().unwrap(),
    );
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let max_abs = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    eprintln!("logits: max |leangrad - pytorch| = {max_abs:.3e}, relative to max |logit| {scale:.3}: {:.3e}", max_abs / scale);
    // Measured: 2.6e-6 max-abs, 4.8e-7 of the largest logit (f32 against
    // PyTorch's f64).
    assert!(
        max_abs <= 1e-6 * scale,
        "max abs diff {max_abs} of max |logit| {scale}"
    );
}
