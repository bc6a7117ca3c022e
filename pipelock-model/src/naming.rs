//! What a row is called: `pipe:[ino]` for a pipe's locks, the pipe call a
//! foreign lock was contended in (with what the lock is where the programs
//! recognised it: `rq_lock(cpu 1)`, `pi_lock(cat 4242)`), `dentry:NAME`
//! for a lockref.
use pipelock_common::{LockInfo, known};

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

/// Names `lock` from what the programs recorded about it (`LOCK_INFO`);
/// `symbol`: the kernel data symbol the address is in, if any (a static
/// lock such as `jiffies_lock`), for a lock the programs did not recognise.
pub fn identify(lock: u64, info: Option<&LockInfo>, symbol: Option<&str>) -> Identity {
    let class = info.and_then(|i| LockClass::from_id(i.class));
    let pipe_ino = info
        .filter(|_| class != Some(LockClass::Lockref))
        .map(|i| i.ino)
        .filter(|ino| *ino != 0);
    let pipe = pipe_ino.map_or_else(|| "pipe:[?]".to_owned(), |ino| format!("pipe:[{ino}]"));
    let name = match class {
        Some(LockClass::OtherInPipeCall) => {
            let what = match (info.map(|i| i.known), symbol) {
                (Some(known::NOTHING), Some(symbol)) => symbol.to_owned(),
                _ => info.map_or_else(|| format!("{lock:#x}"), |i| foreign_lock(lock, i)),
            };
            format!("{what} in {pipe} call")
        }
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

/// A lock that is not the pipe's, by what the programs recognised it as.
fn foreign_lock(lock: u64, info: &LockInfo) -> String {
    match info.known {
        known::RUN_QUEUE => format!("rq_lock(cpu {})", info.detail),
        known::TASK_PI => format!("pi_lock({} {})", comm_text(&info.name[..16]), info.detail),
        known::PIPE_MUTEX_WAIT_LOCK => "mutex.wait_lock".to_owned(),
        _ => format!("{lock:#x}"),
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
        let mutex = identify(0x1000, Some(&info(LockClass::PipeMutex, 42, b"")), None);
        assert_eq!(
            (mutex.class, mutex.pipe_ino, mutex.name.as_str()),
            (Some(LockClass::PipeMutex), Some(42), "pipe:[42]")
        );
        let other = identify(
            0xffff_8880_0000_0040,
            Some(&info(LockClass::OtherInPipeCall, 42, b"")),
            None,
        );
        assert_eq!(other.name, "0xffff888000000040 in pipe:[42] call");
        let static_lock = identify(
            0xffff_ffff_8200_0008,
            Some(&info(LockClass::OtherInPipeCall, 42, b"")),
            Some("jiffies_lock+0x8"),
        );
        assert_eq!(static_lock.name, "jiffies_lock+0x8 in pipe:[42] call");
        let mut rq = info(LockClass::OtherInPipeCall, 42, b"");
        (rq.known, rq.detail) = (known::RUN_QUEUE, 1);
        assert_eq!(
            identify(0x40, Some(&rq), Some("runqueues+0x40")).name,
            "rq_lock(cpu 1) in pipe:[42] call"
        );
        let mut pi = info(LockClass::OtherInPipeCall, 42, b"pipelock\0");
        (pi.known, pi.detail) = (known::TASK_PI, 4242);
        assert_eq!(
            identify(0x40, Some(&pi), None).name,
            "pi_lock(pipelock 4242) in pipe:[42] call"
        );
        let dentry = identify(0x2000, Some(&info(LockClass::Lockref, 7, b"stat-target")), None);
        assert_eq!(
            (dentry.pipe_ino, dentry.name.as_str()),
            (None, "dentry:stat-target"),
            "a dentry has no pipe inode"
        );
        assert_eq!(
            identify(0x2000, Some(&info(LockClass::Lockref, 0, b"")), None).name,
            "dentry:?"
        );
        assert_eq!(
            identify(0x1000, Some(&info(LockClass::PipeRdWait, 0, b"")), None).name,
            "pipe:[?]"
        );
        let unknown = identify(0x3000, None, Some("ignored"));
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
