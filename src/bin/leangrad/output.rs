//! Where the command line writes: results on stdout (only JSON under
//! `--json`), progress for people on stdout or, under `--json`, on stderr.
//! A reader that closes stdout early (`leangrad memory … | head -1`) ends
//! the program quietly: the write is [`PipeClosed`], which `main` turns
//! into a successful exit without a message.

use anyhow::Result;
use std::io::Write;

/// Stdout was closed by its reader; nothing more can be shown.
#[derive(Debug)]
pub struct PipeClosed;

impl std::fmt::Display for PipeClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for PipeClosed {}

/// Writes `text` to stdout and flushes it; a closed pipe is [`PipeClosed`].
pub fn stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(PipeClosed.into()),
        other => Ok(other?),
    }
}

/// Writes `text` to stderr; a closed stderr is ignored (there is nowhere
/// else to report it).
pub fn stderr(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Progress lines of a command: on stdout, or on stderr when the command
/// writes JSON (so that stdout holds the JSON only).
#[derive(Clone, Copy)]
pub struct Progress {
    /// Whether stdout is reserved for JSON.
    pub json: bool,
}

impl Progress {
    /// Writes one line (a newline is added).
    pub fn line(self, text: &str) -> Result<()> {
        let text = format!("{text}\n");
        if self.json {
            stderr(&text);
            Ok(())
        } else {
            stdout(&text)
        }
    }
}

/// Writes a job's report: as JSON only, or described for people.
pub fn report<R: serde::Serialize>(
    report: &R,
    json: bool,
    describe: fn(&R) -> String,
) -> Result<()> {
    let text = if json {
        serde_json::to_string_pretty(report)? + "\n"
    } else {
        describe(report)
    };
    stdout(&text)
}

/// [`report`] for a job whose report has no wall time of its own: adds
/// `seconds` (the whole run, as the other jobs report) to the JSON, and a
/// last line to the text.
pub fn report_timed<R: serde::Serialize>(
    report: &R,
    json: bool,
    describe: fn(&R) -> String,
    seconds: f64,
) -> Result<()> {
    let text = if json {
        let mut v = serde_json::to_value(report)?;
        if let Some(fields) = v.as_object_mut() {
            fields.entry("seconds").or_insert(seconds.into());
        }
        serde_json::to_string_pretty(&v)? + "\n"
    } else {
        describe(report) + &format!("finished in {seconds:.1} s\n")
    };
    stdout(&text)
}
