//! The safetensors format: an 8-byte little-endian header length, a JSON
//! header `{name: {dtype, shape, data_offsets}}`, then the raw little-endian
//! data. The header is checked here first (so that every fault names its
//! tensor and no arithmetic can overflow), then parsed by the `safetensors`
//! crate.

use crate::{DType, Device, Error, Result, Tensor, WithDType};
use half::{bf16, f16};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::Path;

const IN_MEMORY: &str = "<bytes>";

fn malformed(what: &str, tensor: Option<&str>, reason: impl Into<String>) -> Error {
    Error::MalformedWeights {
        what: what.to_string(),
        tensor: tensor.map(str::to_string),
        reason: reason.into(),
    }
}

/// The leangrad dtype of a file dtype name, if there is one.
fn dtype_from_name(name: &str) -> Option<DType> {
    Some(match name {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "F64" => DType::F64,
        "U8" => DType::U8,
        "U32" => DType::U32,
        "I64" => DType::I64,
        _ => return None,
    })
}

fn to_file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F64 => Dtype::F64,
        DType::U8 => Dtype::U8,
        DType::U32 => Dtype::U32,
        DType::I64 => Dtype::I64,
    }
}

fn from_file_dtype(name: &str, dtype: Dtype) -> Result<DType> {
    let text = format!("{dtype:?}");
    dtype_from_name(&text).ok_or(Error::UnsupportedWeightDType {
        tensor: name.to_string(),
        dtype: text,
    })
}

/// One header entry's `(dtype, shape, data_offsets)`, checked for form.
fn entry(
    what: &str,
    name: &str,
    v: &serde_json::Value,
) -> Result<(String, Vec<usize>, [usize; 2])> {
    let bad = |reason: &str| malformed(what, Some(name), reason);
    let dtype = v["dtype"]
        .as_str()
        .ok_or_else(|| bad("no string `dtype`"))?;
    let shape = v["shape"]
        .as_array()
        .ok_or_else(|| bad("no array `shape`"))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| bad("`shape` is not a list of sizes"))?;
    let offsets = v["data_offsets"]
        .as_array()
        .filter(|a| a.len() == 2)
        .and_then(|a| {
            let s = usize::try_from(a[0].as_u64()?).ok()?;
            let e = usize::try_from(a[1].as_u64()?).ok()?;
            Some([s, e])
        })
        .ok_or_else(|| bad("`data_offsets` is not a pair of offsets"))?;
    Ok((dtype.to_string(), shape, offsets))
}

/// Checks the header of `bytes` entry by entry: supported dtypes, offsets
/// inside the data, and data lengths that match shape × dtype size.
fn check_header(what: &str, bytes: &[u8]) -> Result<()> {
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| malformed(what, None, format!("{} bytes is too short", bytes.len())))?;
    let n = u64::from_le_bytes(len_bytes);
    let rest = (bytes.len() - 8) as u64;
    if n > rest {
        return Err(malformed(
            what,
            None,
            format!("header length {n} exceeds the {rest} bytes after it"),
        ));
    }
    let header = &bytes[8..8 + n as usize];
    let data_len = bytes.len() - 8 - n as usize;
    let text = std::str::from_utf8(header)
        .map_err(|e| malformed(what, None, format!("header is not UTF-8: {e}")))?;
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| malformed(what, None, format!("header is not valid JSON: {e}")))?;
    let map = json
        .as_object()
        .ok_or_else(|| malformed(what, None, "header is not a JSON object"))?;
    for (name, v) in map.iter().filter(|(k, _)| k.as_str() != "__metadata__") {
        let (dtype, shape, [s, e]) = entry(what, name, v)?;
        let dt = dtype_from_name(&dtype).ok_or_else(|| Error::UnsupportedWeightDType {
            tensor: name.clone(),
            dtype: dtype.clone(),
        })?;
        if s > e || e > data_len {
            return Err(malformed(
                what,
                Some(name),
                format!("data offsets [{s}, {e}] lie outside the {data_len} data bytes"),
            ));
        }
        let want = shape
            .iter()
            .try_fold(dt.size_in_bytes(), |a, &d| a.checked_mul(d));
        if want != Some(e - s) {
            return Err(malformed(
                what,
                Some(name),
                format!(
                    "{} data bytes do not match shape {shape:?} of {dtype}",
                    e - s
                ),
            ));
        }
    }
    Ok(())
}

fn decode<T: WithDType, const N: usize>(
    raw: &[u8],
    from: fn([u8; N]) -> T,
    shape: &[usize],
) -> Result<Tensor> {
    let v: Vec<T> = raw
        .chunks_exact(N)
        .map(|c| from(c.try_into().expect("chunks_exact gives N bytes")))
        .collect();
    Tensor::from_vec(v, shape, Device::Cpu)
}

fn to_tensor(name: &str, view: &TensorView<'_>) -> Result<Tensor> {
    let (raw, shape) = (view.data(), view.shape());
    match from_file_dtype(name, view.dtype())? {
        DType::F32 => decode(raw, f32::from_le_bytes, shape),
        DType::F16 => decode(raw, |b| f16::from_bits(u16::from_le_bytes(b)), shape),
        DType::BF16 => decode(raw, |b| bf16::from_bits(u16::from_le_bytes(b)), shape),
        DType::F64 => decode(raw, f64::from_le_bytes, shape),
        DType::U8 => decode(raw, u8::from_le_bytes, shape),
        DType::U32 => decode(raw, u32::from_le_bytes, shape),
        DType::I64 => decode(raw, i64::from_le_bytes, shape),
    }
}

fn parse(what: &str, bytes: &[u8]) -> Result<BTreeMap<String, Tensor>> {
    check_header(what, bytes)?;
    let file = SafeTensors::deserialize(bytes).map_err(|e| malformed(what, None, e.to_string()))?;
    file.iter()
        .map(|(name, view)| Ok((name.to_string(), to_tensor(name, &view)?)))
        .collect()
}

/// Reads every tensor of the safetensors file at `path`, as new CPU tensors
/// counted in the current ledger. Supported dtypes: F32, F16, BF16, F64, U8,
/// U32 and I64; any other gives [`Error::UnsupportedWeightDType`], a damaged
/// file [`Error::MalformedWeights`].
///
/// A file that cannot be read is [`Error::File`] naming it; a PyTorch
/// file (what `torch.save` writes, usually `.pt`/`.pth`) is
/// [`Error::MalformedWeights`] pointing to [`super::load_weights`], which
/// reads both formats.
pub fn load_safetensors(path: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| Error::File {
        path: path.to_path_buf(),
        action: "read",
        source,
    })?;
    let what = path.display().to_string();
    let pickle_name = path
        .extension()
        .is_some_and(|e| ["pt", "pth", "pkl", "ckpt"].contains(&&*e.to_string_lossy()));
    parse(&what, &bytes).map_err(|e| pickle_hint(e, &what, &bytes, pickle_name))
}

/// [`load_safetensors`] from an in-memory buffer.
pub fn load_safetensors_bytes(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>> {
    parse(IN_MEMORY, bytes).map_err(|e| pickle_hint(e, IN_MEMORY, bytes, false))
}

/// Whether `bytes` start as `torch.save` output does: a zip archive (its
/// format since PyTorch 1.6) or a bare pickle (protocol 2 to 5, older
/// files). Asked only of bytes that failed as safetensors: a safetensors
/// header length can begin with the same bytes.
fn looks_like_pickle(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || matches!(bytes, [0x80, 2..=5, ..])
}

/// Turns the failure to read a PyTorch file as safetensors (recognised
/// by its first bytes, or by its `.pt`/`.pth` name) into a message saying
/// what reads it; other errors pass through.
fn pickle_hint(e: Error, what: &str, bytes: &[u8], pickle_name: bool) -> Error {
    if !matches!(e, Error::MalformedWeights { .. }) || !(pickle_name || looks_like_pickle(bytes)) {
        return e;
    }
    let p = if what == IN_MEMORY { "p" } else { what };
    let convert = format!(
        "convert it once in Python: `import torch, safetensors.torch; \
         safetensors.torch.save_file(torch.load({p:?}), \"w.safetensors\")` \
         (a state dict; for a whole pickled model, save `model.state_dict()`)"
    );
    let reason = if bytes.starts_with(b"PK\x03\x04") {
        format!(
            "this is a PyTorch pickle (torch.save's zip format), not a safetensors file: \
             `leangrad::io::load_weights` reads it (and safetensors files), or {convert}"
        )
    } else {
        format!(
            "this is a PyTorch pickle (what torch.save writes), not a safetensors file; {convert}"
        )
    };
    malformed(what, None, reason)
}

fn encode<T: WithDType, const N: usize>(t: &Tensor, to: fn(T) -> [u8; N]) -> Result<Vec<u8>> {
    Ok(t.to_vec::<T>()?.into_iter().flat_map(to).collect())
}

fn raw_bytes(t: &Tensor) -> Result<Vec<u8>> {
    match t.dtype() {
        DType::F32 => encode(t, f32::to_le_bytes),
        DType::F16 => encode(t, |v: f16| v.to_bits().to_le_bytes()),
        DType::BF16 => encode(t, |v: bf16| v.to_bits().to_le_bytes()),
        DType::F64 => encode(t, f64::to_le_bytes),
        DType::U8 => encode(t, u8::to_le_bytes),
        DType::U32 => encode(t, u32::to_le_bytes),
        DType::I64 => encode(t, i64::to_le_bytes),
    }
}

/// The safetensors bytes of `tensors` (any layout; written contiguous and
/// little-endian). Names must be distinct.
pub fn serialize_safetensors(tensors: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let mut seen = std::collections::BTreeSet::new();
    let mut data = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(Error::InvalidArgument {
                op: "save_safetensors",
                msg: format!("tensor name `{name}` appears twice"),
            });
        }
        data.push((name.clone(), raw_bytes(t)?));
    }
    let views = tensors
        .iter()
        .zip(&data)
        .map(|((_, t), (name, raw))| {
            let view = TensorView::new(to_file_dtype(t.dtype()), t.shape().to_vec(), raw)
                .map_err(|e| malformed(IN_MEMORY, Some(name), e.to_string()))?;
            Ok((name.as_str(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, None).map_err(|e| Error::InvalidArgument {
        op: "save_safetensors",
        msg: e.to_string(),
    })
}

/// Writes `tensors` to `path` as a safetensors file that
/// [`load_safetensors`] reads back exactly.
pub fn save_safetensors(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    let bytes = serialize_safetensors(tensors)?;
    let path = path.as_ref();
    std::fs::write(path, bytes).map_err(|source| Error::File {
        path: path.to_path_buf(),
        action: "write",
        source,
    })
}
