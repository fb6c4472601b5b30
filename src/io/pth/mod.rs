//! PyTorch's own weight files: what `torch.save(model.state_dict(), "x.pth")`
//! writes (the zip format of PyTorch 1.6 and later), read without Python
//! and without running anything in the file.
//!
//! A `.pth`/`.pt` file is a zip archive: `<top>/data.pkl` (a pickle of the
//! saved object, each tensor a view into a storage named by a persistent
//! id), `<top>/data/<key>` (each storage's raw little-endian bytes, stored
//! uncompressed), `<top>/byteorder` and `<top>/version`; `<top>` is
//! whatever folder name the archive's first entry has. `zip.rs` reads the
//! archive, `pickle.rs` is a restricted unpickler (the globals of a state
//! dict and nothing else, as `torch.load(weights_only=True)`), and this
//! file checks each tensor's view against its storage and gathers it into
//! a contiguous leangrad tensor.
//!
//! What loads: a dict of tensors (a `state_dict()`, an `OrderedDict`, or
//! `dict(model.named_parameters())`); or a training checkpoint, a dict
//! without tensors of its own whose one dict of tensors sits under one key
//! (`{"epoch": 3, "model": model.state_dict(), "optimizer": …}` loads
//! `model`'s tensors). dtypes: f32, f64, f16, bf16, uint8, int64 and
//! uint32 as they are; bool as u8, int8/int16/int32 as i64 and uint16 as
//! u32 (the same values); others (complex, uint64, float8, quantized) are
//! [`Error::UnsupportedWeightDType`] naming the tensor.

mod pickle;
mod zip;

use crate::{Device, Error, Result, Tensor, WithDType};
use half::{bf16, f16};
use pickle::{Entries, Kind, TensorRef, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use zip::{Archive, FileSource, Source};

/// The first bytes of a zip archive (and so of every `torch.save` file
/// since PyTorch 1.6).
pub(crate) const ZIP_MAGIC: &[u8] = b"PK\x03\x04";

/// The first bytes of a legacy (before PyTorch 1.6) `torch.save` file:
/// protocol 2, then its magic number as a 10-byte LONG1.
pub(crate) const LEGACY_MAGIC: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";

const IN_MEMORY: &str = "<bytes>";

/// The loaded tensors may need at most this many bytes per byte of the
/// file, plus [`OUTPUT_SLACK`]: a view can repeat its storage's elements
/// (stride 0) and many names can view one storage, so without a bound a
/// small file could ask for any amount of memory. A real state dict needs
/// about 1 (2 where weights are tied).
const OUTPUT_PER_FILE_BYTE: u64 = 8;
/// See [`OUTPUT_PER_FILE_BYTE`]: room for broadcast buffers of small files.
const OUTPUT_SLACK: u64 = 64 << 20;

fn malformed(what: &str, tensor: Option<&str>, reason: impl Into<String>) -> Error {
    Error::MalformedWeights {
        what: what.to_string(),
        tensor: tensor.map(str::to_string),
        reason: reason.into(),
    }
}

/// Reads every tensor of the PyTorch file at `path` (what `torch.save`
/// writes, usually `.pth` or `.pt`) as new CPU tensors counted in the
/// current ledger, by their names in the file.
///
/// A damaged file, a legacy (pre-1.6) file, or a pickle that names any
/// global beyond a state dict's (a pickled model, `os.system`, …) is
/// [`Error::MalformedWeights`] saying which; nothing in the file is run.
/// A file that cannot be read is [`Error::File`] naming it.
pub fn load_pth(path: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>> {
    let path = path.as_ref();
    let src = FileSource::open(path)?;
    let what = path.display().to_string();
    load(&src, &what)
}

/// [`load_pth`] from an in-memory buffer.
pub fn load_pth_bytes(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>> {
    load(bytes, IN_MEMORY)
}

fn load<S: Source + ?Sized>(src: &S, what: &str) -> Result<BTreeMap<String, Tensor>> {
    let head = src.read(0, src.len().min(LEGACY_MAGIC.len() as u64) as usize)?;
    if !head.starts_with(ZIP_MAGIC) {
        return Err(not_zip(what, &head));
    }
    drop(head);
    let archive = Archive::open(src, what)?;
    let top = top_folder(&archive, what)?;
    check_byte_order(&archive, what, &top)?;
    let pkl = archive.read(&format!("{top}/data.pkl"))?;
    let root =
        pickle::unpickle(&pkl).map_err(|e| malformed(what, None, format!("data.pkl at {e}")))?;
    drop(pkl);
    let refs = state_dict(&root).map_err(|e| malformed(what, None, e))?;
    materialize(&archive, what, &top, &refs)
}

/// The error for bytes that are not a zip archive: a legacy PyTorch
/// pickle, or something else.
fn not_zip(what: &str, head: &[u8]) -> Error {
    let reason = if head.starts_with(LEGACY_MAGIC) {
        "a PyTorch file in the legacy format (before PyTorch 1.6), which is not read: \
         re-save it with a recent PyTorch, `torch.save(torch.load(p, weights_only=True), \"new.pth\")`"
    } else if matches!(head, [0x80, 2..=5, ..]) {
        "a bare Python pickle, not a PyTorch zip archive: re-save the state dict with \
         `torch.save(state_dict, \"new.pth\")`"
    } else {
        "not a PyTorch file (it does not start as a zip archive)"
    };
    malformed(what, None, reason)
}

/// The archive's top folder, from its first entry; and a clear refusal of
/// TorchScript archives, which hold code instead of a plain pickle.
fn top_folder<S: Source + ?Sized>(archive: &Archive<'_, S>, what: &str) -> Result<String> {
    let first = archive
        .names
        .first()
        .ok_or_else(|| malformed(what, None, "the zip archive is empty"))?;
    let (top, _) = first.split_once('/').ok_or_else(|| {
        malformed(
            what,
            None,
            format!("the first entry `{first}` is not inside a folder"),
        )
    })?;
    if archive.entry(&format!("{top}/constants.pkl")).is_some() {
        return Err(malformed(
            what,
            None,
            "a TorchScript archive (torch.jit.save), not a state dict: save \
             `model.state_dict()` with torch.save instead",
        ));
    }
    if archive.entry(&format!("{top}/data.pkl")).is_none() {
        return Err(malformed(
            what,
            None,
            format!("the archive has no `{top}/data.pkl`"),
        ));
    }
    Ok(top.to_string())
}

/// Refuses big-endian data (PyTorch writes the machine's byte order; a
/// missing record means little-endian, as PyTorch assumes).
fn check_byte_order<S: Source + ?Sized>(
    archive: &Archive<'_, S>,
    what: &str,
    top: &str,
) -> Result<()> {
    let name = format!("{top}/byteorder");
    match archive.entry(&name) {
        None => return Ok(()),
        Some(e) if e.size > 16 => {
            return Err(malformed(what, None, "the byteorder record is damaged"))
        }
        Some(_) => {}
    }
    match archive.read(&name)?.trim_ascii() {
        b"little" => Ok(()),
        b"big" => Err(malformed(
            what,
            None,
            "the tensors are big-endian, which is not read: re-save the file on a little-endian machine",
        )),
        other => Err(malformed(
            what,
            None,
            format!("unknown byte order {:?}", String::from_utf8_lossy(other)),
        )),
    }
}

/// The entries of `d` as named tensors, or why they are not.
fn as_tensors(d: &Entries) -> std::result::Result<BTreeMap<String, Rc<TensorRef>>, String> {
    let mut out = BTreeMap::new();
    for (k, v) in d {
        let Value::Str(name) = k else {
            return Err(format!("a key is {}, not a string", k.type_name()));
        };
        let Value::Tensor(t) = v else {
            return Err(format!("entry `{name}` is {}, not a tensor", v.type_name()));
        };
        // As in Python, a key set twice keeps its last value.
        out.insert(name.to_string(), t.clone());
    }
    Ok(out)
}

fn key_name(k: &Value) -> String {
    match k {
        Value::Str(s) => s.to_string(),
        other => format!("<{}>", other.type_name()),
    }
}

/// The named tensors of the unpickled object: a dict of tensors, or the one
/// dict of tensors inside a checkpoint dict that holds none itself.
fn state_dict(root: &Value) -> std::result::Result<BTreeMap<String, Rc<TensorRef>>, String> {
    let Value::Dict(d) = root else {
        return Err(format!(
            "the file holds {}, not a dict of tensors (a state dict)",
            root.type_name()
        ));
    };
    let entries = d.items.borrow();
    let direct = as_tensors(&entries);
    if direct.is_ok() || entries.iter().any(|(_, v)| matches!(v, Value::Tensor(_))) {
        return direct;
    }
    let mut found = Vec::new();
    for (k, v) in entries.iter() {
        if let Value::Dict(inner) = v {
            let inner = inner.items.borrow();
            if !inner.is_empty() {
                if let Ok(t) = as_tensors(&inner) {
                    found.push((key_name(k), t));
                }
            }
        }
    }
    match found.len() {
        1 => Ok(found.pop().map(|(_, t)| t).unwrap_or_default()),
        0 => {
            let listed: Vec<String> = entries
                .iter()
                .take(8)
                .map(|(k, v)| format!("`{}` ({})", key_name(k), v.type_name()))
                .collect();
            Err(format!(
                "the file's dict holds no tensors, nor one dict of tensors; its entries: {}{}",
                listed.join(", "),
                if entries.len() > 8 { ", …" } else { "" }
            ))
        }
        _ => {
            let keys: Vec<String> = found.iter().map(|(k, _)| format!("`{k}`")).collect();
            Err(format!(
                "the file holds several state dicts ({}): save the one to load alone, \
                 e.g. `torch.save(checkpoint[\"{}\"], \"model.pth\")`",
                keys.join(", "),
                found[0].0
            ))
        }
    }
}

/// A tensor's checked geometry, in elements of its file dtype.
struct Geom {
    shape: Vec<usize>,
    stride: Vec<usize>,
    offset: usize,
    numel: usize,
    /// Bytes of the tensor's storage entry.
    storage_bytes: u64,
}

/// Checks tensor `name`'s view against its storage: a dtype leangrad
/// reads, non-negative sizes, strides and offset, and every element it
/// reaches inside the storage.
fn geometry(what: &str, name: &str, t: &TensorRef) -> Result<Geom> {
    let bad = |reason: String| malformed(what, Some(name), reason);
    let unsupported = |k: Kind| Error::UnsupportedWeightDType {
        tensor: name.to_string(),
        dtype: k.torch_name().to_string(),
    };
    let es = t.kind.size().ok_or_else(|| unsupported(t.kind))? as u64;
    let ses = t
        .storage
        .kind
        .size()
        .ok_or_else(|| unsupported(t.storage.kind))? as u64;
    let storage_bytes = t.storage.numel.checked_mul(ses).ok_or_else(|| {
        bad(format!(
            "its storage's size of {} elements overflows",
            t.storage.numel
        ))
    })?;
    let to_u64 =
        |v: i64, of: &str| u64::try_from(v).map_err(|_| bad(format!("{of} {v} is negative")));
    let offset = to_u64(t.offset, "storage offset")?;
    let size = t
        .size
        .iter()
        .map(|&d| to_u64(d, "size"))
        .collect::<Result<Vec<u64>>>()?;
    let stride = t
        .stride
        .iter()
        .map(|&d| to_u64(d, "stride"))
        .collect::<Result<Vec<u64>>>()?;
    let overflow = || {
        bad(format!(
            "shape {:?} with strides {:?} overflows",
            t.size, t.stride
        ))
    };
    let numel = size
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(overflow)?;
    // The element just past the furthest one the view reaches.
    let end = if numel == 0 {
        offset
    } else {
        size.iter()
            .zip(&stride)
            .try_fold(offset, |a, (&d, &s)| a.checked_add((d - 1).checked_mul(s)?))
            .and_then(|last| last.checked_add(1))
            .ok_or_else(overflow)?
    };
    if end.checked_mul(es).is_none_or(|b| b > storage_bytes) {
        return Err(bad(format!(
            "its view (offset {offset}, shape {:?}, strides {:?}) needs {end} elements of {es} bytes, \
             but its storage holds {storage_bytes} bytes",
            t.size, t.stride
        )));
    }
    let us = |v: u64| usize::try_from(v).map_err(|_| overflow());
    Ok(Geom {
        shape: size.iter().map(|&d| us(d)).collect::<Result<_>>()?,
        stride: stride.iter().map(|&d| us(d)).collect::<Result<_>>()?,
        offset: us(offset)?,
        numel: us(numel)?,
        storage_bytes,
    })
}

/// Reads each storage once and gathers every tensor that views it.
fn materialize<S: Source + ?Sized>(
    archive: &Archive<'_, S>,
    what: &str,
    top: &str,
    refs: &BTreeMap<String, Rc<TensorRef>>,
) -> Result<BTreeMap<String, Tensor>> {
    // Check every tensor before reading any data.
    let mut by_storage: BTreeMap<&str, Vec<(&str, &TensorRef, Geom)>> = BTreeMap::new();
    let budget = archive
        .len()
        .saturating_mul(OUTPUT_PER_FILE_BYTE)
        .saturating_add(OUTPUT_SLACK);
    let mut total = 0u64;
    for (name, t) in refs {
        let g = geometry(what, name, t)?;
        let entry = format!("{top}/data/{}", t.storage.key);
        let size = archive.entry(&entry).map(|e| e.size).ok_or_else(|| {
            malformed(
                what,
                Some(name),
                format!("its storage `{entry}` is not in the archive"),
            )
        })?;
        if size != g.storage_bytes {
            return Err(malformed(
                what,
                Some(name),
                format!(
                    "its storage `{entry}` holds {size} bytes, but the pickle declares {} elements of {} ({} bytes)",
                    t.storage.numel,
                    t.storage.kind.torch_name(),
                    g.storage_bytes
                ),
            ));
        }
        total = total
            .saturating_add((g.numel as u64).saturating_mul(t.kind.size().unwrap_or(0) as u64));
        if total > budget {
            return Err(malformed(
                what,
                Some(name),
                format!(
                    "the tensors up to this one need {total} bytes, more than {OUTPUT_PER_FILE_BYTE} \
                     times the file's {} bytes plus {OUTPUT_SLACK}: views that repeat their \
                     storages' elements (stride 0, or one storage named many times) are bounded",
                    archive.len()
                ),
            ));
        }
        by_storage
            .entry(&t.storage.key)
            .or_default()
            .push((name, t, g));
    }
    let mut out = BTreeMap::new();
    for (key, tensors) in by_storage {
        let raw = archive.read(&format!("{top}/data/{key}"))?;
        for (name, t, g) in tensors {
            let tensor = decode(&raw, &g, t.kind).map_err(|e| match e {
                Error::MalformedWeights { reason, .. } => malformed(what, Some(name), reason),
                Error::UnsupportedWeightDType { dtype, .. } => Error::UnsupportedWeightDType {
                    tensor: name.to_string(),
                    dtype,
                },
                other => other,
            })?;
            out.insert(name.to_string(), tensor);
        }
    }
    Ok(out)
}

/// The tensor of `g`'s elements of `raw`, converted to the leangrad dtype
/// that holds `kind` losslessly.
fn decode(raw: &[u8], g: &Geom, kind: Kind) -> Result<Tensor> {
    match kind {
        Kind::F32 => gather(raw, g, f32::from_le_bytes),
        Kind::F64 => gather(raw, g, f64::from_le_bytes),
        Kind::F16 => gather(raw, g, |b| f16::from_bits(u16::from_le_bytes(b))),
        Kind::BF16 => gather(raw, g, |b| bf16::from_bits(u16::from_le_bytes(b))),
        Kind::U8 | Kind::Bool => gather(raw, g, u8::from_le_bytes),
        Kind::I8 => gather(raw, g, |b| i64::from(i8::from_le_bytes(b))),
        Kind::I16 => gather(raw, g, |b| i64::from(i16::from_le_bytes(b))),
        Kind::I32 => gather(raw, g, |b| i64::from(i32::from_le_bytes(b))),
        Kind::I64 => gather(raw, g, i64::from_le_bytes),
        Kind::U16 => gather(raw, g, |b| u32::from(u16::from_le_bytes(b))),
        Kind::U32 => gather(raw, g, u32::from_le_bytes),
        Kind::Other(name) => Err(Error::UnsupportedWeightDType {
            tensor: String::new(),
            dtype: name.to_string(),
        }),
    }
}

/// Whether `g` is row-major contiguous (sizes of 1 may have any stride).
fn contiguous(g: &Geom) -> bool {
    let mut want = 1usize;
    for (&d, &s) in g.shape.iter().zip(&g.stride).rev() {
        if d != 1 && s != want {
            return false;
        }
        want = want.saturating_mul(d);
    }
    true
}

/// Gathers the view `g` of `raw` (elements of `N` bytes) into a new
/// contiguous tensor, converting each element with `conv`.
fn gather<T: WithDType, const N: usize>(
    raw: &[u8],
    g: &Geom,
    conv: impl Fn([u8; N]) -> T,
) -> Result<Tensor> {
    let short = || malformed(IN_MEMORY, None, "its view reaches past its storage");
    let mut out = crate::memory::host::try_vec::<T>(g.numel)?;
    let chunk =
        |i: usize| -> Option<[u8; N]> { raw.get(i.checked_mul(N)?..)?.get(..N)?.try_into().ok() };
    if contiguous(g) {
        let span = raw
            .get(g.offset * N..)
            .and_then(|r| r.get(..g.numel * N))
            .ok_or_else(short)?;
        out.extend(
            span.chunks_exact(N)
                .map(|c| conv(c.try_into().expect("chunks_exact gives N bytes"))),
        );
    } else if g.numel > 0 {
        // An odometer over the index; positions wrap exactly back into
        // range (every reachable one was checked by `geometry`).
        let mut index = vec![0usize; g.shape.len()];
        let mut pos = g.offset;
        for _ in 0..g.numel {
            out.push(conv(chunk(pos).ok_or_else(short)?));
            for d in (0..index.len()).rev() {
                index[d] += 1;
                pos = pos.wrapping_add(g.stride[d]);
                if index[d] < g.shape[d] {
                    break;
                }
                pos = pos.wrapping_sub(g.stride[d].wrapping_mul(g.shape[d]));
                index[d] = 0;
            }
        }
    }
    Tensor::from_vec(out, &g.shape, Device::Cpu)
}

/// Whether `bytes` start as a `torch.save` file does (zip, or the legacy
/// pickle).
pub(crate) fn looks_like_pth(bytes: &[u8]) -> bool {
    bytes.starts_with(ZIP_MAGIC) || bytes.starts_with(LEGACY_MAGIC)
}
