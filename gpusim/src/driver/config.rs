//! The simulated machine's shape, from the environment:
//! `GPUSIM_DEVICE_COUNT` (default 1), `GPUSIM_MEMORY_BYTES` (per device,
//! default 16G; suffixes K, M, G, T in powers of 1024), `GPUSIM_COMPUTE`
//! (compute capability, default "8.0"), `GPUSIM_NCCL_TIMEOUT_MS` (how long
//! a NCCL rank waits for the others, default 30000).

/// Devices, memory and compute capability of the simulated machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Number of devices.
    pub devices: usize,
    /// Bytes of memory of each device.
    pub memory_bytes: u64,
    /// Compute capability (major, minor).
    pub compute: (i32, i32),
    /// How long NCCL waits for the other ranks of a communicator (to join,
    /// or to enqueue their part of a collective), ms.
    pub nccl_timeout_ms: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            devices: 1,
            memory_bytes: 16 << 30,
            compute: (8, 0),
            nccl_timeout_ms: 30_000,
        }
    }
}

/// Parses a byte count: digits with an optional suffix K, M, G or T
/// (also KB/KiB…, any case), each a power of 1024.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 16G, 512M, 1048576)"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(format!("{s:?}: unknown suffix {suffix:?} (K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses a compute capability such as "8.0" or "9.0".
pub fn parse_compute(s: &str) -> Result<(i32, i32), String> {
    let bad = || format!("{s:?} is not a compute capability such as 8.0 or 9.0");
    let (a, b) = s.trim().split_once('.').ok_or_else(bad)?;
    let major: i32 = a.parse().map_err(|_| bad())?;
    let minor: i32 = b.parse().map_err(|_| bad())?;
    if !(1..=99).contains(&major) || !(0..=9).contains(&minor) {
        return Err(bad());
    }
    Ok((major, minor))
}

impl Config {
    /// The configuration from `get(name)` (the environment in use), or
    /// what is wrong with it.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(v) = get("GPUSIM_DEVICE_COUNT") {
            c.devices = v
                .trim()
                .parse()
                .ok()
                .filter(|&n: &usize| n <= 64)
                .ok_or_else(|| format!("GPUSIM_DEVICE_COUNT={v:?}: expected 0 to 64"))?;
        }
        if let Some(v) = get("GPUSIM_MEMORY_BYTES") {
            c.memory_bytes = parse_bytes(&v).map_err(|e| format!("GPUSIM_MEMORY_BYTES: {e}"))?;
        }
        if let Some(v) = get("GPUSIM_COMPUTE") {
            c.compute = parse_compute(&v).map_err(|e| format!("GPUSIM_COMPUTE: {e}"))?;
        }
        if let Some(v) = get("GPUSIM_NCCL_TIMEOUT_MS") {
            c.nccl_timeout_ms = v
                .trim()
                .parse()
                .ok()
                .filter(|&ms: &u64| ms > 0)
                .ok_or_else(|| {
                    format!("GPUSIM_NCCL_TIMEOUT_MS={v:?}: expected a positive number of ms")
                })?;
        }
        Ok(c)
    }

    /// The configuration from the process environment.
    pub fn from_env() -> Result<Config, String> {
        Config::from_vars(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_and_compute_capabilities_parse() {
        assert_eq!(parse_bytes("16G"), Ok(16 << 30));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("4kib"), Ok(4096));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("G").is_err());
        assert!(parse_bytes("99999999999T").is_err());
        assert_eq!(parse_compute("9.0"), Ok((9, 0)));
        assert_eq!(parse_compute("8.6"), Ok((8, 6)));
        assert!(parse_compute("90").is_err());
        let c = Config::from_vars(|k| match k {
            "GPUSIM_DEVICE_COUNT" => Some("2".into()),
            "GPUSIM_MEMORY_BYTES" => Some("1M".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            c,
            Config {
                devices: 2,
                memory_bytes: 1 << 20,
                compute: (8, 0),
                nccl_timeout_ms: 30_000,
            }
        );
        assert!(Config::from_vars(|k| (k == "GPUSIM_COMPUTE").then(|| "x".into())).is_err());
        let t = Config::from_vars(|k| (k == "GPUSIM_NCCL_TIMEOUT_MS").then(|| "250".into()));
        assert_eq!(t.map(|c| c.nccl_timeout_ms), Ok(250));
        assert!(
            Config::from_vars(|k| (k == "GPUSIM_NCCL_TIMEOUT_MS").then(|| "0".into())).is_err()
        );
    }
}
