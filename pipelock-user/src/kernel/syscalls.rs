//! Names of the x86-64 system calls a pipe's locks are taken in, for
//! reports that say which call a thread was in.

/// The name of x86-64 system call `nr`, for the calls that reach a pipe;
/// `syscall N` for any other, None outside a system call (`nr` < 0).
pub fn syscall_name(nr: i32) -> Option<String> {
    let name = match nr {
        ..0 => return None,
        0 => "read",
        1 => "write",
        3 => "close",
        7 => "poll",
        16 => "ioctl",
        19 => "readv",
        20 => "writev",
        22 => "pipe",
        23 => "select",
        32 => "dup",
        33 => "dup2",
        72 => "fcntl",
        232 => "epoll_wait",
        257 => "openat",
        270 => "pselect6",
        271 => "ppoll",
        275 => "splice",
        276 => "tee",
        278 => "vmsplice",
        281 => "epoll_pwait",
        292 => "dup3",
        293 => "pipe2",
        295 => "preadv",
        296 => "pwritev",
        426 => "io_uring_enter",
        _ => return Some(format!("syscall {nr}")),
    };
    Some(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipe_calls_are_named_and_others_numbered() {
        assert_eq!(syscall_name(72).as_deref(), Some("fcntl"));
        assert_eq!(syscall_name(1).as_deref(), Some("write"));
        assert_eq!(syscall_name(999).as_deref(), Some("syscall 999"));
        assert_eq!(syscall_name(-1), None);
    }
}
