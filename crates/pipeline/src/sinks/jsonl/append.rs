//! Opening a file for appending, after cutting the partial tail a crash left (a partial line,
//! or a partial gzip member).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::Compression;

/// Opens `path` for appending, cutting a trailing partial line (a partial gzip member with
/// `Compression::Gzip`). Returns the file and its size.
pub(super) fn open_append(path: &Path, compression: Compression) -> std::io::Result<(File, u64)> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)?;
    let len = file.metadata()?.len();
    let keep = match compression {
        Compression::None => complete_length(&mut file, len)?,
        Compression::Gzip => complete_gzip_length(&mut file)?,
    };
    if keep < len {
        file.set_len(keep)?;
        file.sync_data()?;
        tracing::warn!(
            file = %path.display(),
            cut_bytes = len - keep,
            "Cut a trailing partial line left by an interrupted write."
        );
    }
    // Writes go to the end (`O_APPEND`) whatever the read position is.
    Ok((file, keep))
}

/// The length of `file` up to and including its last newline.
fn complete_length(file: &mut File, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut chunk = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let size = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk[..size])?;
        if let Some(pos) = chunk[..size].iter().rposition(|b| *b == b'\n') {
            return Ok(start + pos as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// The length of the complete gzip members at the start of `file`.
fn complete_gzip_length(file: &mut File) -> std::io::Result<u64> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::new(&mut *file);
    let mut complete = 0;
    loop {
        if reader.fill_buf()?.is_empty() {
            return Ok(complete);
        }
        let mut member = flate2::bufread::GzDecoder::new(&mut reader);
        match std::io::copy(&mut member, &mut std::io::sink()) {
            Ok(_) => complete = reader.stream_position()?,
            Err(_) => return Ok(complete),
        }
    }
}
