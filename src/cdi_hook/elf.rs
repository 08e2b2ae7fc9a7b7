//! Whether a program is a static ELF executable: one that needs no loader and no library, so
//! it runs the same once the container root is its root. The host's ldconfig is run that way
//! (see [`super::sandbox`]); a dynamic one would load the image's libc and loader there, and a
//! script would run the image's shell, both as root.
//!
//! Only the ELF header and the program headers are read: a static program is an ELF file with
//! no `PT_INTERP` header (static-pie included).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// `PT_INTERP`: the program names a loader.
const PT_INTERP: u32 = 3;

/// Most program headers looked at: real programs have about a dozen.
const MAX_HEADERS: u16 = 256;

/// What kind of program a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// An ELF executable with no loader.
    Static,
    /// An ELF executable that names a loader.
    Dynamic,
    /// A `#!` script.
    Script,
    /// Anything else (or a file too short or malformed to tell).
    Other,
}

/// Classifies the open file `file` by its first bytes and program headers.
pub fn classify(file: &File) -> std::io::Result<Program> {
    let mut ident = [0u8; 64];
    let read = read_at_most(file, &mut ident, 0)?;
    let ident = &ident[..read];
    if ident.starts_with(b"#!") {
        return Ok(Program::Script);
    }
    if read < 64 || !ident.starts_with(b"\x7fELF") {
        return Ok(Program::Other);
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Ok(Program::Other),
    };
    let little = match ident[5] {
        1 => true,
        2 => false,
        _ => return Ok(Program::Other),
    };
    let field = Field { little };
    let (phoff, phentsize, phnum) = if wide {
        (
            field.u64(&ident[32..40]),
            field.u16(&ident[54..56]),
            field.u16(&ident[56..58]),
        )
    } else {
        (
            u64::from(field.u32(&ident[28..32])),
            field.u16(&ident[42..44]),
            field.u16(&ident[44..46]),
        )
    };
    if phnum > MAX_HEADERS || usize::from(phentsize) < 4 || phentsize > 64 {
        return Ok(Program::Other);
    }
    let mut header = [0u8; 64];
    for index in 0..u64::from(phnum) {
        let offset = index
            .checked_mul(u64::from(phentsize))
            .and_then(|o| o.checked_add(phoff));
        let Some(offset) = offset else {
            return Ok(Program::Other);
        };
        let entry = &mut header[..usize::from(phentsize)];
        if read_at_most(file, entry, offset)? < entry.len() {
            return Ok(Program::Other);
        }
        if field.u32(&entry[0..4]) == PT_INTERP {
            return Ok(Program::Dynamic);
        }
    }
    Ok(Program::Static)
}

/// Fills as much of `buf` as the file has from `offset`.
fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(done)
}

/// Reads the header's integers in its byte order.
struct Field {
    little: bool,
}

impl Field {
    fn u16(&self, bytes: &[u8]) -> u16 {
        let bytes = [bytes[0], bytes[1]];
        if self.little {
            u16::from_le_bytes(bytes)
        } else {
            u16::from_be_bytes(bytes)
        }
    }

    fn u32(&self, bytes: &[u8]) -> u32 {
        let bytes = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if self.little {
            u32::from_le_bytes(bytes)
        } else {
            u32::from_be_bytes(bytes)
        }
    }

    fn u64(&self, bytes: &[u8]) -> u64 {
        let mut array = [0u8; 8];
        array.copy_from_slice(&bytes[..8]);
        if self.little {
            u64::from_le_bytes(array)
        } else {
            u64::from_be_bytes(array)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify_path(path: &str) -> Program {
        classify(&File::open(path).unwrap()).unwrap()
    }

    #[test]
    fn the_hosts_programs_are_told_apart() {
        // Debian's and Ubuntu's ldconfig(.real) is static; the test binary is not.
        let ldconfig = ["/sbin/ldconfig.real", "/sbin/ldconfig"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists())
            .unwrap();
        assert_eq!(classify_path(ldconfig), Program::Static);
        let me = std::env::current_exe().unwrap();
        assert_eq!(classify_path(me.to_str().unwrap()), Program::Dynamic);
    }

    #[test]
    fn scripts_short_files_and_bad_headers() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            File::open(path).unwrap()
        };
        assert_eq!(
            classify(&write("s", b"#!/bin/sh\n")).unwrap(),
            Program::Script
        );
        assert_eq!(classify(&write("e", b"")).unwrap(), Program::Other);
        assert_eq!(
            classify(&write("short", b"\x7fELF\x02\x01")).unwrap(),
            Program::Other
        );
        // A 64-bit header whose program headers lie past the end of the file.
        let mut header = vec![0u8; 64];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        header[32..40].copy_from_slice(&4096u64.to_le_bytes());
        header[54..56].copy_from_slice(&56u16.to_le_bytes());
        header[56..58].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(classify(&write("past", &header)).unwrap(), Program::Other);
        // No program headers at all: nothing names a loader.
        header[56..58].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(classify(&write("none", &header)).unwrap(), Program::Static);
    }
}
