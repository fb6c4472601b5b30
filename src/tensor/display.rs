//! `format!("{t}")`: a tensor's values as PyTorch's `repr` prints them
//! (`torch/_tensor_str.py` with the default print options): precision 4,
//! scientific notation when the nonzero finite magnitudes span more than
//! 1000× or reach 1e8 (or, for non-integers, fall below 1e-4), floats whose
//! values are all integers printed as `1.`, summarised with `...` (three
//! items at each edge) above 1000 elements, lines wrapped at 80 columns,
//! then the suffixes PyTorch adds: `device='cuda:0'`, `dtype=torch.float64`
//! (not for f32 and i64, PyTorch's defaults), `requires_grad=True`.
//!
//! Where leangrad differs: a tensor produced by a recorded op prints
//! `requires_grad=True` where PyTorch names its `grad_fn`, and a tensor
//! whose values cannot be read prints the error in place of the values.

use super::Tensor;
use crate::{DType, Device};
use std::fmt;

/// Digits after the point (PyTorch's `precision`).
const PRECISION: usize = 4;
/// Above this many elements the tensor is summarised (`threshold`).
const THRESHOLD: usize = 1000;
/// Items kept at each edge of a summarised dimension (`edgeitems`).
const EDGE_ITEMS: usize = 3;
/// Columns a line of values may take (`linewidth`).
const LINE_WIDTH: usize = 80;

/// The values of a tensor, in row-major order.
enum Values {
    /// Float dtypes, as f64 (f16/bf16/f32 convert exactly).
    Float(Vec<f64>),
    /// Integer dtypes.
    Int(Vec<i64>),
}

/// How every element is printed: chosen once from all the (summarised)
/// values, as PyTorch's `_Formatter`.
struct Formatter {
    int_mode: bool,
    sci_mode: bool,
    width: usize,
}

/// `v` as Python's `f"{v:.{precision}e}"` writes it (`1.2346e+05`,
/// `nan`, `-inf`).
fn sci(v: f64, precision: usize) -> String {
    if !v.is_finite() {
        return special(v);
    }
    let s = format!("{v:.precision$e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
}

/// `v` as Python's `f"{v:.{precision}f}"` writes it.
fn fixed(v: f64, precision: usize) -> String {
    if v.is_finite() {
        format!("{v:.precision$}")
    } else {
        special(v)
    }
}

/// Python's spelling of a non-finite float.
fn special(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

impl Formatter {
    /// The formatter of `values` (the summarised ones when summarising).
    fn new(values: &Values) -> Formatter {
        let mut f = Formatter {
            int_mode: true,
            sci_mode: false,
            width: 1,
        };
        let v = match values {
            Values::Int(v) => {
                f.width = v.iter().map(|x| x.to_string().len()).max().unwrap_or(1);
                return f;
            }
            Values::Float(v) => v,
        };
        let finite: Vec<f64> = v
            .iter()
            .copied()
            .filter(|x| x.is_finite() && *x != 0.0)
            .collect();
        if finite.is_empty() {
            return f;
        }
        let min = finite.iter().fold(f64::INFINITY, |m, x| m.min(x.abs()));
        let max = finite.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        f.int_mode = finite.iter().all(|x| *x == x.ceil());
        let wide = max / min > 1000.0 || max > 1.0e8;
        f.sci_mode = wide || (!f.int_mode && min < 1.0e-4);
        f.width = finite
            .iter()
            .map(|&x| {
                if f.sci_mode {
                    sci(x, PRECISION).len()
                } else if f.int_mode {
                    format!("{x:.0}").len() + 1
                } else {
                    fixed(x, PRECISION).len()
                }
            })
            .max()
            .unwrap_or(1);
        f
    }

    /// One element, right-aligned to the common width.
    fn float(&self, v: f64) -> String {
        let s = if self.sci_mode {
            sci(v, PRECISION)
        } else if self.int_mode {
            let mut s = if v.is_finite() {
                format!("{v:.0}")
            } else {
                special(v)
            };
            if v.is_finite() {
                s.push('.');
            }
            s
        } else {
            fixed(v, PRECISION)
        };
        self.pad(s)
    }

    fn int(&self, v: i64) -> String {
        self.pad(v.to_string())
    }

    fn pad(&self, s: String) -> String {
        let n = self.width.saturating_sub(s.len());
        format!("{}{s}", " ".repeat(n))
    }

    fn element(&self, values: &Values, i: usize) -> String {
        match values {
            Values::Float(v) => self.float(v[i]),
            Values::Int(v) => self.int(v[i]),
        }
    }
}

/// The positions kept along a dimension of `size`: all of them, or the
/// first and last [`EDGE_ITEMS`] with `None` for the `...` between.
fn kept(size: usize, summarize: bool) -> Vec<Option<usize>> {
    if summarize && size > 2 * EDGE_ITEMS {
        let head = (0..EDGE_ITEMS).map(Some);
        let tail = (size - EDGE_ITEMS..size).map(Some);
        head.chain([None]).chain(tail).collect()
    } else {
        (0..size).map(Some).collect()
    }
}

/// Row-major offsets of the elements PyTorch's `get_summarized_data`
/// keeps (what the formatter is chosen from).
fn summarized_offsets(shape: &[usize], summarize: bool) -> Vec<usize> {
    let mut offsets = vec![0usize];
    for &size in shape {
        let keep: Vec<usize> = kept(size, summarize).into_iter().flatten().collect();
        offsets = offsets
            .iter()
            .flat_map(|&o| keep.iter().map(move |&k| o * size + k))
            .collect();
    }
    offsets
}

/// What [`tensor_str`] prints with.
struct Printer<'a> {
    values: &'a Values,
    fmt: Formatter,
    summarize: bool,
}

impl Printer<'_> {
    /// The nested lists of the sub-tensor at row-major `offset` of
    /// `shape`, PyTorch's `_tensor_str_with_formatter`.
    fn tensor_str(&self, shape: &[usize], offset: usize, indent: usize) -> String {
        let Some((&size, rest)) = shape.split_first() else {
            return self.fmt.element(self.values, offset);
        };
        let inner: usize = rest.iter().product();
        if rest.is_empty() {
            return self.vector_str(size, offset, indent);
        }
        let slices: Vec<String> = kept(size, self.summarize)
            .into_iter()
            .map(|i| match i {
                Some(i) => self.tensor_str(rest, offset + i * inner, indent + 1),
                None => "...".to_string(),
            })
            .collect();
        let sep = format!(
            ",{}{}",
            "\n".repeat(shape.len() - 1),
            " ".repeat(indent + 1)
        );
        format!("[{}]", slices.join(&sep))
    }

    /// One row, wrapped to [`LINE_WIDTH`] (PyTorch's `_vector_str`).
    fn vector_str(&self, size: usize, offset: usize, indent: usize) -> String {
        let element_length = self.fmt.width + 2;
        let room = LINE_WIDTH.saturating_sub(indent);
        let per_line = (room / element_length).max(1);
        let data: Vec<String> = kept(size, self.summarize)
            .into_iter()
            .map(|i| match i {
                Some(i) => self.fmt.element(self.values, offset + i),
                None => " ...".to_string(),
            })
            .collect();
        let lines: Vec<String> = data.chunks(per_line).map(|c| c.join(", ")).collect();
        format!(
            "[{}]",
            lines.join(&format!(",\n{}", " ".repeat(indent + 1)))
        )
    }
}

/// PyTorch's name of a dtype (`torch.float64`, …).
fn torch_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "torch.float32",
        DType::F16 => "torch.float16",
        DType::BF16 => "torch.bfloat16",
        DType::F64 => "torch.float64",
        DType::U8 => "torch.uint8",
        DType::U32 => "torch.uint32",
        DType::I64 => "torch.int64",
    }
}

/// A shape as Python prints a tuple: `(2, 3)`, `(5,)`, `()`.
fn py_tuple(shape: &[usize]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => {
            let items: Vec<String> = shape.iter().map(|s| s.to_string()).collect();
            format!("({})", items.join(", "))
        }
    }
}

/// `body` followed by the suffixes, each on the same line while it fits
/// in [`LINE_WIDTH`], else on a new line (PyTorch's `_add_suffixes`).
fn add_suffixes(body: String, suffixes: &[String], indent: usize) -> String {
    let mut out = body;
    // PyTorch's arithmetic: `len - rfind("\n") + 1`, with rfind = -1 when
    // there is no newline.
    let mut last_line = match out.rfind('\n') {
        Some(p) => out.len() - p + 1,
        None => out.len() + 2,
    };
    for s in suffixes {
        if last_line + s.len() + 2 > LINE_WIDTH {
            out.push_str(&format!(",\n{}{s}", " ".repeat(indent)));
            last_line = indent + s.len();
        } else {
            out.push_str(&format!(", {s}"));
            last_line += s.len() + 2;
        }
    }
    out.push(')');
    out
}

/// The values of `t`, or why they cannot be read.
fn read(t: &Tensor) -> crate::Result<Values> {
    Ok(match t.dtype() {
        DType::I64 => Values::Int(t.to_vec::<i64>()?),
        DType::U8 | DType::U32 => {
            Values::Int(t.to_f64_vec()?.into_iter().map(|v| v as i64).collect())
        }
        _ => Values::Float(t.to_f64_vec()?),
    })
}

impl fmt::Display for Tensor {
    /// PyTorch's `repr` of the tensor, e.g.
    /// `tensor([[ 0.1000, -1.2000]], dtype=torch.float64, requires_grad=True)`
    /// (see the module documentation for the rules).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const PREFIX: &str = "tensor(";
        let indent = PREFIX.len();
        let dtype = self.dtype();
        let mut suffixes = Vec::new();
        if self.device() != Device::Cpu {
            suffixes.push(format!("device='{}'", self.device()));
        }
        let body = if self.device().is_meta() {
            suffixes.push(format!("size={}", py_tuple(self.shape())));
            if dtype != DType::F32 {
                suffixes.push(format!("dtype={}", torch_dtype(dtype)));
            }
            "...".to_string()
        } else if self.numel() == 0 {
            if self.shape().len() != 1 {
                suffixes.push(format!("size={}", py_tuple(self.shape())));
            }
            if dtype != DType::F32 {
                suffixes.push(format!("dtype={}", torch_dtype(dtype)));
            }
            "[]".to_string()
        } else {
            if !matches!(dtype, DType::F32 | DType::I64) {
                suffixes.push(format!("dtype={}", torch_dtype(dtype)));
            }
            match read(self) {
                Ok(values) => {
                    let summarize = self.numel() > THRESHOLD;
                    let picked = summarized_offsets(self.shape(), summarize);
                    let sample = match &values {
                        Values::Float(v) => Values::Float(picked.iter().map(|&o| v[o]).collect()),
                        Values::Int(v) => Values::Int(picked.iter().map(|&o| v[o]).collect()),
                    };
                    let printer = Printer {
                        values: &values,
                        fmt: Formatter::new(&sample),
                        summarize,
                    };
                    printer.tensor_str(self.shape(), 0, indent)
                }
                Err(e) => format!("<values unavailable: {e}>"),
            }
        };
        if self.requires_grad() {
            suffixes.push("requires_grad=True".into());
        }
        f.write_str(&add_suffixes(format!("{PREFIX}{body}"), &suffixes, indent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_spellings() {
        assert_eq!(sci(123456.0, 4), "1.2346e+05");
        assert_eq!(sci(-1.0e-5, 4), "-1.0000e-05");
        assert_eq!(sci(1.0e100, 4), "1.0000e+100");
        assert_eq!(sci(f64::NAN, 4), "nan");
        assert_eq!(fixed(f64::NEG_INFINITY, 4), "-inf");
        assert_eq!(py_tuple(&[5]), "(5,)");
        assert_eq!(py_tuple(&[]), "()");
        assert_eq!(py_tuple(&[2, 3]), "(2, 3)");
    }

    #[test]
    fn summarised_offsets_keep_the_edges() {
        assert_eq!(summarized_offsets(&[8], true), vec![0, 1, 2, 5, 6, 7]);
        assert_eq!(summarized_offsets(&[2, 7], true).len(), 12);
        assert_eq!(summarized_offsets(&[4], false), vec![0, 1, 2, 3]);
    }
}
