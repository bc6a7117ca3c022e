//! A minimal writer of the `newc` cpio format the kernel unpacks as initramfs.
use std::io::{self, Write};

/// One archive member.
pub enum Entry<'a> {
    Dir {
        path: &'a str,
    },
    File {
        path: &'a str,
        mode: u32,
        data: &'a [u8],
    },
}

fn pad4(out: &mut impl Write, len: usize) -> io::Result<()> {
    out.write_all(&[0u8; 3][..(4 - len % 4) % 4])
}

fn header(out: &mut impl Write, ino: u32, mode: u32, size: usize, name: &str) -> io::Result<()> {
    let name_len = name.len() + 1;
    let fields = [ino, mode, 0, 0, 1, 0, size as u32, 0, 0, 0, 0, name_len as u32, 0];
    write!(out, "070701")?;
    for field in fields {
        write!(out, "{field:08x}")?;
    }
    out.write_all(name.as_bytes())?;
    out.write_all(&[0])?;
    // The 110-byte header plus the name is padded to a multiple of 4.
    pad4(out, 110 + name_len)
}

/// Writes `entries` and the trailer. Parent directories must come first.
pub fn write(out: &mut impl Write, entries: &[Entry<'_>]) -> io::Result<()> {
    for (ino, entry) in (1..).zip(entries) {
        match entry {
            Entry::Dir { path } => header(out, ino, 0o040_755, 0, path)?,
            Entry::File { path, mode, data } => {
                header(out, ino, 0o100_000 | mode, data.len(), path)?;
                out.write_all(data)?;
                pad4(out, data.len())?;
            }
        }
    }
    header(out, 0, 0, 0, "TRAILER!!!")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout_is_aligned_and_terminated() {
        let mut out = Vec::new();
        write(
            &mut out,
            &[
                Entry::Dir { path: "bin" },
                Entry::File {
                    path: "init",
                    mode: 0o755,
                    data: b"hello",
                },
            ],
        )
        .unwrap();
        assert!(out.starts_with(b"070701"));
        assert_eq!(out.len() % 4, 0);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("init\0"));
        assert!(text.contains("hello"));
        assert!(text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!\0"));
        // Second header (the file) starts 4-aligned and declares size 5.
        let file_header = text
            .find("070701")
            .and_then(|first| text[first + 6..].find("070701").map(|i| i + first + 6))
            .unwrap();
        assert_eq!(file_header % 4, 0);
        assert_eq!(
            &text[file_header + 6 + 6 * 8..file_header + 6 + 7 * 8],
            "00000005"
        );
    }
}
