//! What a row is called: `pipe:[ino]` for a pipe's locks, the pipe call a
//! foreign lock was contended in, `dentry:NAME` for a lockref.
use pipelock_common::LockInfo;

use super::class::LockClass;

/// A lock as the report names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// None when the programs could not record what the lock is.
    pub class: Option<LockClass>,
    /// The pipe's inode number, for a pipe's locks and other-in-pipe-call rows.
    pub pipe_ino: Option<u64>,
    pub name: String,
}

/// Names `lock` from what the programs recorded about it (`LOCK_INFO`).
pub fn identify(lock: u64, info: Option<&LockInfo>) -> Identity {
    let class = info.and_then(|i| LockClass::from_id(i.class));
    let pipe_ino = info
        .filter(|_| class != Some(LockClass::Lockref))
        .map(|i| i.ino)
        .filter(|ino| *ino != 0);
    let pipe = pipe_ino.map_or_else(|| "pipe:[?]".to_owned(), |ino| format!("pipe:[{ino}]"));
    let name = match class {
        Some(LockClass::OtherInPipeCall) => format!("{lock:#x} in {pipe} call"),
        Some(LockClass::Lockref) => {
            let raw = info.map(|i| i.name).unwrap_or_default();
            let name = String::from_utf8_lossy(raw.split(|b| *b == 0).next().unwrap_or(&[])).into_owned();
            if name.is_empty() {
                "dentry:?".to_owned()
            } else {
                format!("dentry:{name}")
            }
        }
        Some(_) => pipe,
        None => format!("{lock:#x} (identity not recorded)"),
    };
    Identity {
        class,
        pipe_ino,
        name,
    }
}

/// A task name as the kernel stores it (NUL-padded), as text.
pub fn comm_text(comm: &[u8]) -> String {
    String::from_utf8_lossy(comm.split(|b| *b == 0).next().unwrap_or(&[])).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(class: LockClass, ino: u64, name: &[u8]) -> LockInfo {
        let mut info = LockInfo {
            pipe: 0x1000,
            ino,
            class: class.id(),
            ..LockInfo::default()
        };
        info.name[..name.len()].copy_from_slice(name);
        info
    }

    #[test]
    fn each_class_is_named_as_the_report_shows_it() {
        let mutex = identify(0x1000, Some(&info(LockClass::PipeMutex, 42, b"")));
        assert_eq!(
            (mutex.class, mutex.pipe_ino, mutex.name.as_str()),
            (Some(LockClass::PipeMutex), Some(42), "pipe:[42]")
        );
        let other = identify(
            0xffff_8880_0000_0040,
            Some(&info(LockClass::OtherInPipeCall, 42, b"")),
        );
        assert_eq!(other.name, "0xffff888000000040 in pipe:[42] call");
        let dentry = identify(0x2000, Some(&info(LockClass::Lockref, 7, b"stat-target")));
        assert_eq!(
            (dentry.pipe_ino, dentry.name.as_str()),
            (None, "dentry:stat-target"),
            "a dentry has no pipe inode"
        );
        assert_eq!(
            identify(0x2000, Some(&info(LockClass::Lockref, 0, b""))).name,
            "dentry:?"
        );
        assert_eq!(
            identify(0x1000, Some(&info(LockClass::PipeRdWait, 0, b""))).name,
            "pipe:[?]"
        );
        let unknown = identify(0x3000, None);
        assert_eq!(
            (unknown.class, unknown.name.as_str()),
            (None, "0x3000 (identity not recorded)")
        );
    }

    #[test]
    fn comms_stop_at_the_first_nul() {
        assert_eq!(comm_text(b"cat\0\0\0garbage"), "cat");
        assert_eq!(comm_text(b"exactly15bytes!"), "exactly15bytes!");
    }
}
