//! A reader of the zip archives `torch.save` writes: the central directory
//! (zip64 included, for archives past 4 GiB), entries stored (what
//! PyTorch writes) or deflated (what re-zipping tools write), each entry's
//! CRC-32 checked. Every offset and size read from the archive is checked
//! against the archive's length before it is used, and an entry's bytes are
//! allocated through the checked host allocator only once its declared size
//! is known to fit the archive (or, deflated, deflate's largest ratio).
//!
//! The `zip` crate would do the same in more code and with its own
//! allocations; PyTorch archives need only this part of the format.

use super::malformed;
use crate::{Error, Result};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// Where an archive's bytes come from: a buffer, or a file read piece by
/// piece (so a multi-gigabyte checkpoint is never held twice).
pub(super) trait Source {
    /// The length in bytes.
    fn len(&self) -> u64;
    /// `len` bytes from `offset` (already checked to lie inside).
    fn read(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>>;
}

impl Source for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }

    fn read(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>> {
        usize::try_from(offset)
            .ok()
            .and_then(|s| self.get(s..s.checked_add(len)?))
            .map(Cow::Borrowed)
            .ok_or_else(|| malformed("<bytes>", None, "read past the end of the buffer"))
    }
}

/// A file opened for reading, with its length at opening time.
pub(super) struct FileSource {
    file: File,
    len: u64,
    path: std::path::PathBuf,
}

impl FileSource {
    /// Opens `path`; a failure is [`Error::File`] naming it.
    pub(super) fn open(path: &std::path::Path) -> Result<FileSource> {
        let fail = |source| Error::File {
            path: path.to_path_buf(),
            action: "read",
            source,
        };
        let file = File::open(path).map_err(fail)?;
        let len = file.metadata().map_err(fail)?.len();
        Ok(FileSource {
            file,
            len,
            path: path.to_path_buf(),
        })
    }
}

impl Source for FileSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>> {
        let fail = |source| Error::File {
            path: self.path.clone(),
            action: "read",
            source,
        };
        let mut buf = crate::memory::host::try_zeroed::<u8>(len)?;
        let mut f = &self.file;
        f.seek(SeekFrom::Start(offset)).map_err(fail)?;
        f.read_exact(&mut buf).map_err(fail)?;
        Ok(Cow::Owned(buf))
    }
}

/// One central-directory entry.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    method: u16,
    crc: u32,
    compressed: u64,
    /// The uncompressed size.
    pub(super) size: u64,
    local: u64,
}

/// An opened archive: its entries by name.
pub(super) struct Archive<'a, S: Source + ?Sized> {
    src: &'a S,
    what: &'a str,
    /// Entry names in central-directory order.
    pub(super) names: Vec<String>,
    entries: HashMap<String, Entry>,
}

const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD64_LOCATOR_SIG: u32 = 0x0706_4b50;
const EOCD64_SIG: u32 = 0x0606_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
/// The fixed part of a central-directory entry.
const CENTRAL_LEN: usize = 46;
/// Deflate cannot expand data more than about 1032 to 1.
const MAX_DEFLATE_RATIO: u64 = 1032;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Where the central directory is: `(offset, size, entries)`.
struct Directory {
    offset: u64,
    size: u64,
    count: u64,
}

impl<'a, S: Source + ?Sized> Archive<'a, S> {
    fn bad(&self, reason: impl Into<String>) -> Error {
        malformed(self.what, None, format!("zip archive: {}", reason.into()))
    }

    /// `len` bytes at `offset`, or an error if they are not all inside.
    fn bytes(&self, offset: u64, len: u64, of: &str) -> Result<Cow<'a, [u8]>> {
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > self.src.len()) {
            return Err(self.bad(format!(
                "{of} ({len} bytes at offset {offset}) lies past the end of the {} bytes",
                self.src.len()
            )));
        }
        let len = usize::try_from(len).map_err(|_| self.bad(format!("{of} is too large")))?;
        self.src.read(offset, len)
    }

    /// Opens the archive in `src` (`what` names it in errors): reads and
    /// checks the whole central directory.
    pub(super) fn open(src: &'a S, what: &'a str) -> Result<Archive<'a, S>> {
        let mut archive = Archive {
            src,
            what,
            names: Vec::new(),
            entries: HashMap::new(),
        };
        let dir = archive.directory()?;
        // Each entry takes at least CENTRAL_LEN bytes: the count is bounded
        // by the directory's size, itself inside the archive.
        if dir.count > dir.size / CENTRAL_LEN as u64 {
            return Err(archive.bad(format!(
                "{} entries cannot fit a central directory of {} bytes",
                dir.count, dir.size
            )));
        }
        let cd = archive.bytes(dir.offset, dir.size, "the central directory")?;
        let mut at = 0usize;
        for _ in 0..dir.count {
            let (name, entry, next) = archive.central_entry(&cd, at)?;
            at = next;
            if archive.entries.insert(name.clone(), entry).is_some() {
                return Err(archive.bad(format!("entry `{name}` appears twice")));
            }
            archive.names.push(name);
        }
        Ok(archive)
    }

    /// Finds the end-of-central-directory record (and its zip64 twin).
    fn directory(&self) -> Result<Directory> {
        let len = self.src.len();
        if len < 22 {
            return Err(self.bad(format!("{len} bytes is too short for a zip archive")));
        }
        // The record is 22 bytes plus a comment of at most 65535.
        let tail_len = len.min(22 + 65535);
        let tail = self.bytes(len - tail_len, tail_len, "the archive's end")?;
        let pos = (0..=tail.len() - 22)
            .rev()
            .find(|&i| u32_at(&tail, i) == Some(EOCD_SIG))
            .ok_or_else(|| self.bad("no end-of-central-directory record (truncated?)"))?;
        let field = |at| u16_at(&tail, pos + at).unwrap_or(0);
        let (count, size, offset) = (
            field(10),
            u32_at(&tail, pos + 12).unwrap_or(0),
            u32_at(&tail, pos + 16).unwrap_or(0),
        );
        if count != u16::MAX && size != u32::MAX && offset != u32::MAX {
            return Ok(Directory {
                offset: offset.into(),
                size: size.into(),
                count: count.into(),
            });
        }
        // Zip64: a locator just before the record points at the zip64 record.
        let eocd_at = len - tail_len + pos as u64;
        let locator_at = eocd_at
            .checked_sub(20)
            .ok_or_else(|| self.bad("no zip64 locator before the end record"))?;
        let locator = self.bytes(locator_at, 20, "the zip64 locator")?;
        if u32_at(&locator, 0) != Some(EOCD64_LOCATOR_SIG) {
            return Err(self.bad("the zip64 locator's signature is wrong"));
        }
        let rec_at = u64_at(&locator, 8).unwrap_or(u64::MAX);
        let rec = self.bytes(rec_at, 56, "the zip64 end record")?;
        if u32_at(&rec, 0) != Some(EOCD64_SIG) {
            return Err(self.bad("the zip64 end record's signature is wrong"));
        }
        Ok(Directory {
            count: u64_at(&rec, 32).unwrap_or(u64::MAX),
            size: u64_at(&rec, 40).unwrap_or(u64::MAX),
            offset: u64_at(&rec, 48).unwrap_or(u64::MAX),
        })
    }

    /// The central entry at `at` of `cd`: its name, entry and the offset
    /// of the next one.
    fn central_entry(&self, cd: &[u8], at: usize) -> Result<(String, Entry, usize)> {
        let fixed = cd
            .get(at..at + CENTRAL_LEN)
            .filter(|f| u32_at(f, 0) == Some(CENTRAL_SIG))
            .ok_or_else(|| self.bad(format!("central directory entry at {at} is damaged")))?;
        let f16 = |o| u16_at(fixed, o).unwrap_or(0);
        let f32 = |o| u32_at(fixed, o).unwrap_or(0);
        let (flags, method) = (f16(8), f16(10));
        let (name_len, extra_len, comment_len) =
            (f16(28) as usize, f16(30) as usize, f16(32) as usize);
        let name_at = at + CENTRAL_LEN;
        let extra_at = name_at + name_len;
        let next = extra_at + extra_len + comment_len;
        let name = cd
            .get(name_at..extra_at)
            .and_then(|n| std::str::from_utf8(n).ok())
            .ok_or_else(|| self.bad(format!("entry name at {name_at} is damaged or not UTF-8")))?
            .to_string();
        let extra = cd
            .get(extra_at..extra_at + extra_len)
            .filter(|_| next <= cd.len())
            .ok_or_else(|| self.bad(format!("entry `{name}` runs past the central directory")))?;
        if flags & 1 != 0 {
            return Err(self.bad(format!("entry `{name}` is encrypted")));
        }
        let mut entry = Entry {
            method,
            crc: f32(16),
            compressed: f32(20).into(),
            size: f32(24).into(),
            local: f32(42).into(),
        };
        self.zip64_sizes(&name, extra, &mut entry)?;
        Ok((name, entry, next))
    }

    /// Replaces the 32-bit fields that say "see zip64" (all ones) by the
    /// zip64 extra field's values, in the order the format gives them.
    fn zip64_sizes(&self, name: &str, mut extra: &[u8], e: &mut Entry) -> Result<()> {
        let wants = [e.size, e.compressed, e.local].map(|v| v == u64::from(u32::MAX));
        if !wants.contains(&true) {
            return Ok(());
        }
        while let (Some(id), Some(len)) = (u16_at(extra, 0), u16_at(extra, 2)) {
            let body = extra
                .get(4..4 + len as usize)
                .ok_or_else(|| self.bad(format!("entry `{name}`: extra field is cut short")))?;
            if id == 1 {
                let mut at = 0;
                for (want, field) in
                    wants
                        .iter()
                        .zip([&mut e.size, &mut e.compressed, &mut e.local])
                {
                    if *want {
                        *field = u64_at(body, at).ok_or_else(|| {
                            self.bad(format!("entry `{name}`: zip64 field is cut short"))
                        })?;
                        at += 8;
                    }
                }
                return Ok(());
            }
            extra = &extra[4 + len as usize..];
        }
        Err(self.bad(format!("entry `{name}` needs a zip64 extra field it lacks")))
    }

    /// The archive's length in bytes.
    pub(super) fn len(&self) -> u64 {
        self.src.len()
    }

    /// The entry named `name`, if any.
    pub(super) fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// The bytes of entry `name`, uncompressed and CRC-checked.
    pub(super) fn read(&self, name: &str) -> Result<Cow<'a, [u8]>> {
        let e = self
            .entry(name)
            .ok_or_else(|| self.bad(format!("no entry `{name}`")))?;
        let local = self.bytes(e.local, 30, &format!("entry `{name}`'s local header"))?;
        if u32_at(&local, 0) != Some(LOCAL_SIG) {
            return Err(self.bad(format!("entry `{name}`'s local header is damaged")));
        }
        let skip = 30
            + u64::from(u16_at(&local, 26).unwrap_or(0))
            + u64::from(u16_at(&local, 28).unwrap_or(0));
        let data_at = e.local + skip;
        let raw = self.bytes(data_at, e.compressed, &format!("entry `{name}`'s data"))?;
        let data = match e.method {
            0 if e.compressed == e.size => raw,
            0 => {
                return Err(self.bad(format!(
                    "stored entry `{name}` says {} bytes compressed but {} uncompressed",
                    e.compressed, e.size
                )))
            }
            8 => Cow::Owned(self.inflate(name, &raw, e.size)?),
            m => {
                return Err(self.bad(format!(
                    "entry `{name}` uses compression method {m} (only stored and deflate are read)"
                )))
            }
        };
        if crc32fast::hash(&data) != e.crc {
            return Err(self.bad(format!("entry `{name}` fails its CRC-32 check (damaged)")));
        }
        Ok(data)
    }

    /// Inflates a deflated entry into exactly `size` bytes.
    fn inflate(&self, name: &str, raw: &[u8], size: u64) -> Result<Vec<u8>> {
        if size
            > (raw.len() as u64)
                .saturating_mul(MAX_DEFLATE_RATIO)
                .saturating_add(1024)
        {
            return Err(self.bad(format!(
                "deflated entry `{name}` claims {size} bytes from {} (more than deflate can expand)",
                raw.len()
            )));
        }
        let size =
            usize::try_from(size).map_err(|_| self.bad(format!("entry `{name}` is too large")))?;
        let mut out = crate::memory::host::try_zeroed::<u8>(size)?;
        let n = miniz_oxide::inflate::decompress_slice_iter_to_slice(
            &mut out,
            std::iter::once(raw),
            false,
            true,
        )
        .map_err(|s| self.bad(format!("entry `{name}` does not inflate: {s:?}")))?;
        if n != size {
            return Err(self.bad(format!(
                "entry `{name}` inflates to {n} bytes, not the {size} it declares"
            )));
        }
        Ok(out)
    }
}
