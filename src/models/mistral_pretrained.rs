//! Mistral- and Llama-style decoders from a Hugging Face model folder:
//! `config.json` read and checked by its numbers before anything is built,
//! weights from `model.safetensors` or from the shards that
//! `model.safetensors.index.json` lists (how 7B checkpoints are published).

use super::mistral::{Mistral, MistralConfig};
use super::pretrained::{check_fits, on_device, read_json};
use crate::io::{load_safetensors, load_state_dict, LoadOptions};
use crate::{DType, Device, Error, Result, Tensor};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The sizes a decoder's `config.json` may give, inclusive: generous
/// bounds on every published Mistral and Llama (vocabularies up to 256k,
/// widths up to 16k, 128 layers, contexts up to 1M tokens), so that a
/// damaged or hostile file is refused by its numbers before anything is
/// built. `(key, least, most)`.
pub const DECODER_CONFIG_RANGES: [(&str, usize, usize); 9] = [
    ("vocab_size", 1, 1 << 20),
    ("hidden_size", 1, 1 << 16),
    ("intermediate_size", 1, 1 << 18),
    ("num_hidden_layers", 1, 1024),
    ("num_attention_heads", 1, 1 << 12),
    ("num_key_value_heads", 1, 1 << 12),
    ("head_dim", 2, 1 << 12),
    ("max_position_embeddings", 1, 1 << 24),
    ("sliding_window", 1, 1 << 24),
];

/// Reads one `config.json` (the file's values, bounds and defaults).
struct ConfigFile<'a> {
    json: Value,
    path: &'a Path,
}

impl ConfigFile<'_> {
    fn bad(&self, reason: String) -> Error {
        Error::ModelFile {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    /// The whole number at `key` within [`DECODER_CONFIG_RANGES`], or
    /// `default` when the key is absent or `null` (an error without one).
    fn size(&self, key: &str, default: Option<usize>) -> Result<usize> {
        let (_, least, most) = DECODER_CONFIG_RANGES
            .iter()
            .find(|(k, ..)| *k == key)
            .copied()
            .unwrap_or((key, 1, usize::MAX));
        let v = match self.json.get(key) {
            None | Some(Value::Null) => {
                return default.ok_or_else(|| self.bad(format!("`{key}` is missing")))
            }
            Some(v) => v,
        };
        match v.as_u64().and_then(|v| usize::try_from(v).ok()) {
            Some(v) if (least..=most).contains(&v) => Ok(v),
            _ => Err(self.bad(format!("`{key}` is {v}; leangrad reads {least} to {most}"))),
        }
    }

    /// The positive finite number at `key` below `most`, or `default`.
    fn number(&self, json: &Value, key: &str, default: f64, most: f64) -> Result<f64> {
        match json.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0 && *x < most)
                .ok_or_else(|| self.bad(format!("`{key}` is {v}; it must be in (0, {most})"))),
        }
    }

    /// `rope_theta` (top level, or transformers 5's `rope_parameters`),
    /// refusing scaled variants (YaRN, linear, dynamic, Llama 3's), whose
    /// frequencies leangrad does not compute.
    fn rope_theta(&self) -> Result<f64> {
        let params = self.json.get("rope_parameters").filter(|v| !v.is_null());
        let scaling = self.json.get("rope_scaling").filter(|v| !v.is_null());
        let kind = params
            .or(scaling)
            .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
            .and_then(Value::as_str);
        if scaling.is_some() || kind.is_some_and(|k| k != "default") {
            return Err(self.bad(format!(
                "rotary scaling {} is not supported (only the default rotary embeddings)",
                kind.unwrap_or("(unnamed)")
            )));
        }
        let from = params.unwrap_or(&self.json);
        self.number(from, "rope_theta", 10_000.0, 1e12)
    }

    /// Refuses what the architecture lacks: another activation, biases.
    fn check_architecture(&self) -> Result<()> {
        let kind = self.json.get("model_type").and_then(Value::as_str);
        if let Some(k) = kind.filter(|k| !matches!(*k, "mistral" | "llama")) {
            return Err(self.bad(format!(
                "`model_type` is \"{k}\"; leangrad reads \"mistral\" and \"llama\" folders"
            )));
        }
        if let Some(a) = self
            .json
            .get("hidden_act")
            .filter(|a| a.as_str() != Some("silu"))
        {
            return Err(self.bad(format!(
                "`hidden_act` is {a}; the decoder has only \"silu\""
            )));
        }
        for key in ["attention_bias", "mlp_bias"] {
            if self.json.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(self.bad(format!("`{key}` is true; the decoder has no biases")));
            }
        }
        Ok(())
    }
}

impl MistralConfig {
    /// The configuration in a Hugging Face `config.json` of a Mistral or
    /// Llama model (`MistralConfig`/`LlamaConfig` fields;
    /// `num_key_value_heads` defaults to the query heads, `head_dim` to
    /// `hidden_size / num_attention_heads`, `rms_norm_eps` to 1e-6,
    /// `rope_theta` to 10000, `sliding_window` to none, `tie_word_embeddings`
    /// to false). [`Error::ModelFile`] for a missing size, one outside
    /// [`DECODER_CONFIG_RANGES`], heads that do not divide, an activation
    /// other than `silu`, biases, or scaled rotary embeddings.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<MistralConfig> {
        let path = path.as_ref();
        let file = ConfigFile {
            json: read_json(path)?,
            path,
        };
        file.check_architecture()?;
        let heads = file.size("num_attention_heads", None)?;
        let hidden = file.size("hidden_size", None)?;
        let config = MistralConfig {
            vocab_size: file.size("vocab_size", None)?,
            hidden_size: hidden,
            intermediate_size: file.size("intermediate_size", None)?,
            num_hidden_layers: file.size("num_hidden_layers", None)?,
            num_attention_heads: heads,
            num_key_value_heads: file.size("num_key_value_heads", Some(heads))?,
            head_dim: file.size("head_dim", Some(hidden / heads))?,
            max_position_embeddings: file.size("max_position_embeddings", None)?,
            rms_norm_eps: file.number(&file.json, "rms_norm_eps", 1e-6, 1.0)?,
            rope_theta: file.rope_theta()?,
            sliding_window: match file.json.get("sliding_window") {
                None | Some(Value::Null) => None,
                Some(_) => Some(file.size("sliding_window", None)?),
            },
            tie_word_embeddings: file
                .json
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        config
            .check()
            .map_err(|e| file.bad(format!("the sizes do not make a decoder: {e}")))?;
        Ok(config)
    }
}

/// The shards `dir/model.safetensors.index.json` names in its
/// `weight_map`, each a plain file name inside `dir` (a path elsewhere is
/// refused), in order.
fn shard_names(dir: &Path) -> Result<BTreeSet<String>> {
    let index = dir.join("model.safetensors.index.json");
    let json = read_json(&index)?;
    let bad = |reason: String| Error::ModelFile {
        path: index.clone(),
        reason,
    };
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    map.values()
        .map(|v| {
            let name = v.as_str().unwrap_or_default();
            let plain = Path::new(name).file_name().is_some_and(|f| f == name);
            match plain && name.ends_with(".safetensors") {
                true => Ok(name.to_string()),
                false => Err(bad(format!("{v} is not a .safetensors file in the folder"))),
            }
        })
        .collect()
}

/// Every tensor of the folder's weights: `model.safetensors`, or the
/// index's shards (a name in two shards is an error naming both).
fn folder_weights(dir: &Path) -> Result<BTreeMap<String, Tensor>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return load_safetensors(single);
    }
    let mut all = BTreeMap::new();
    for shard in shard_names(dir)? {
        let path = dir.join(&shard);
        for (name, t) in load_safetensors(&path)? {
            if all.insert(name.clone(), t).is_some() {
                return Err(Error::ModelFile {
                    path,
                    reason: format!("`{name}` is also in an earlier shard"),
                });
            }
        }
    }
    Ok(all)
}

impl Mistral {
    /// The decoder of a Hugging Face Mistral or Llama model folder: sizes
    /// from `dir/config.json` ([`MistralConfig::from_json_file`]),
    /// refused before anything is read when its parameters do not fit on
    /// `device`; weights from `dir/model.safetensors` or the shards of
    /// `dir/model.safetensors.index.json`, loaded strictly with
    /// `MistralForCausalLM`'s names (a bare `MistralModel`'s names gain
    /// their `model.` prefix) and cast to `dtype`. Parameters require grad,
    /// as [`Mistral::new`] makes them; freeze with
    /// [`Mistral::set_requires_grad`] or [`super::Freeze`].
    pub fn from_pretrained(dir: impl AsRef<Path>, dtype: DType, device: Device) -> Result<Mistral> {
        let dir = dir.as_ref();
        let config_path = dir.join("config.json");
        let config = MistralConfig::from_json_file(&config_path)?;
        check_fits(
            &config_path,
            "a decoder",
            config.parameter_count(),
            dtype,
            device,
        )?;
        let mut weights = folder_weights(dir)?;
        if !weights.keys().any(|n| n.starts_with("model.")) {
            weights = weights
                .into_iter()
                .map(|(n, t)| (format!("model.{n}"), t))
                .collect();
        }
        let model = Mistral::new(config, dtype, device, 0)?;
        load_state_dict(&model, &on_device(weights, device)?, LoadOptions::default())?;
        Ok(model)
    }
}
