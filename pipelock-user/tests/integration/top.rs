//! `pipelock top` in a real terminal and a pseudo-terminal.
use super::*;

/// `pipelock top` in a real terminal (a private tmux server): pipe lock rows
/// appear while a herd loops, a sort key and the detail pane work, `b`
/// shows the recorded call stacks as rows and Enter one's frames, `q` quits
/// with status 0, and no pipelock program stays loaded.
fn top_runs_in_a_real_terminal_and_detaches() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        return Ok(Outcome::Skipped("tmux is not installed (Debian: tmux)".into()));
    }
    let socket = format!("pipelock-it-{}", std::process::id());
    let status_file = scratch("top.status");
    let _ = fs::remove_file(&status_file);
    let tmux = |args: &[&str]| -> Result<String> {
        let out = run(Command::new("tmux").args(["-L", &socket]).args(args))?;
        ensure!(out.status.success(), "tmux {args:?}: {}", text(&out.stderr));
        Ok(text(&out.stdout))
    };
    let bin = pipelock_path();
    let shell = format!(
        "{bin} top --mode tracepoint --interval 0.5 --callers --workload pipe-herd; echo $? > {}",
        status_file.display()
    );
    tmux(&["new-session", "-d", "-s", "top", "-x", "200", "-y", "50", &shell])?;
    let screen_with = |needle: &str| -> Result<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let screen = tmux(&["capture-pane", "-p", "-t", "top"])?;
            if screen.contains(needle) {
                return Ok(screen);
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "no {needle:?} on the screen after 30 s:\n{screen}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let result = (|| -> Result<()> {
        let screen = screen_with("pipe-mutex")?;
        ensure!(screen.contains("pipelock top · kernel"), "no header:\n{screen}");
        ensure!(
            pipelock_programs_loaded()? > 0,
            "top runs, yet no pipelock program is loaded"
        );
        tmux(&["send-keys", "-t", "top", "t"])?;
        screen_with("total wait▼")?;
        tmux(&["send-keys", "-t", "top", "c"])?;
        screen_with("contended/s▼")?;
        tmux(&["send-keys", "-t", "top", "Enter"])?;
        screen_with("wait since start")?;
        // The call stacks recorded (--callers) as rows of their own; the
        // herd's contended waits come from its pipe writes and reads.
        tmux(&["send-keys", "-t", "top", "Escape"])?;
        // An Esc followed at once by `b` reads as Alt-b: the pane must be
        // seen closed before the next key.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tmux(&["capture-pane", "-p", "-t", "top"])?.contains("wait since start") {
            ensure!(
                std::time::Instant::now() < deadline,
                "Esc did not close the detail pane"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        tmux(&["send-keys", "-t", "top", "b"])?;
        screen_with("b rows [call stacks]")?;
        let screen = screen_with("pipe_write")?;
        ensure!(screen.contains(" < "), "no call stack rows:\n{screen}");
        tmux(&["send-keys", "-t", "top", "Enter"])?;
        screen_with("call stack · Enter/Esc closes")?;
        tmux(&["send-keys", "-t", "top", "q"])?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while !status_file.exists() {
            ensure!(std::time::Instant::now() < deadline, "top did not quit on q");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let status = fs::read_to_string(&status_file)?;
        ensure!(status.trim() == "0", "top exited with {status}");
        let left = programs_left_after_exit()?;
        ensure!(
            left == 0,
            "{left} pipelock program(s) still loaded 10 s after quitting"
        );
        Ok(())
    })();
    let _ = tmux(&["kill-server"]);
    let _ = fs::remove_file(&status_file);
    result.map(|()| Outcome::Passed)
}
register!(Host top_runs_in_a_real_terminal_and_detaches);

/// `pipelock top` on a pseudo-terminal this test drives itself (the VMs have
/// no tmux): where fentry or kprobes work, the detail pane of a pipe lock
/// shows a hold histogram, i.e. the hold columns are filled; `q` quits with
/// status 0 and leaves no pipelock program loaded.
fn top_in_a_pty_shows_hold_times_where_hooks_work() -> Result<Outcome> {
    use std::io::{Read as _, Write as _};
    use std::os::unix::process::CommandExt as _;
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    let mode = match (mode_refusal("fentry")?, mode_refusal("kprobe")?) {
        (None, _) => "fentry",
        (_, None) => "kprobe",
        (Some(why), Some(_)) => {
            return Ok(Outcome::Skipped(format!(
                "hold times need fentry or kprobe ({why}); the tmux test covers tracepoint mode here"
            )));
        }
    };
    let (mut master, slave_path) = open_pty(100, 50)?;
    let slave = fs::OpenOptions::new().read(true).write(true).open(&slave_path)?;
    let mut command = pipelock();
    command
        .args([
            "top",
            "--mode",
            mode,
            "--interval",
            "0.5",
            "--class",
            "pipe-mutex,pipe-wait",
        ])
        .args(["--workload", "pipe-herd"])
        .stdin(slave.try_clone()?)
        .stdout(slave.try_clone()?)
        .stderr(slave);
    // SAFETY: setsid and TIOCSCTTY are async-signal-safe; the slave is fd 0.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            libc::ioctl(0, libc::TIOCSCTTY, 0);
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    // The Command keeps its copies of the slave open; the reader only sees
    // the end of the output once every copy is closed.
    drop(command);
    // The view redraws only changed cells, so the byte stream is replayed
    // into a terminal emulator (vt100) and its screen is what is checked.
    let screen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let screen = screen.clone();
        let mut master = master.try_clone()?;
        std::thread::spawn(move || {
            let mut parser = vt100::Parser::new(50, 100, 0);
            let mut buf = [0u8; 8192];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                parser.process(&buf[..n]);
                if let Ok(mut s) = screen.lock() {
                    *s = parser.screen().contents();
                }
            }
        })
    };
    let seen = |needle: &str, secs: u64| -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let text = screen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
            if text.contains(needle) {
                return Ok(());
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "no {needle:?} on the terminal after {secs} s; the screen:\n{text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let result = (|| -> Result<()> {
        seen("pipe-mutex", 120)?;
        let text = screen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
        first_lines_are_whole(&text, true, false)?;
        ensure!(
            pipelock_programs_loaded()? > 0,
            "top runs, yet no pipelock program is loaded"
        );
        // Sort by hold max, so the row at the top has hold times; open it.
        master.write_all(b"h")?;
        std::thread::sleep(std::time::Duration::from_secs(2));
        master.write_all(b"\r")?;
        seen("hold since start (", 60)?;
        master.write_all(b"q")?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            ensure!(std::time::Instant::now() < deadline, "top did not quit on q");
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        ensure!(status.success(), "top exited with {status}");
        let left = programs_left_after_exit()?;
        ensure!(
            left == 0,
            "{left} pipelock program(s) still loaded 10 s after quitting"
        );
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    drop(master);
    let _ = reader.join();
    result.map(|()| Outcome::Passed)
}
register!(Kernel top_in_a_pty_shows_hold_times_where_hooks_work);

/// The first three lines of `top`'s screen (100 columns) end as they
/// should, so none was cut at the edge: the mode (every 0.5 s), what it
/// measures, and the modes refused (`auto`) or pipelock's own cost.
fn first_lines_are_whole(screen: &str, hooked: bool, refused: bool) -> Result<()> {
    let lines: Vec<&str> = screen.lines().map(str::trim_end).take(3).collect();
    ensure!(
        lines.len() == 3 && lines.iter().all(|l| l.chars().count() <= 100),
        "the first lines:\n{screen}"
    );
    ensure!(
        lines[0].starts_with("pipelock top · kernel ") && lines[0].ends_with(" s, every 0.5 s"),
        "the first line is cut or wrong: {:?}\n{screen}",
        lines[0]
    );
    let measured = pipelock_user::render::header::measured(hooked);
    ensure!(
        lines[1] == measured,
        "the second line is {:?}, want {measured:?}",
        lines[1]
    );
    let third_whole = if refused {
        lines[2].starts_with("refused here: ") && lines[2].ends_with("; details: pipelock probe")
    } else {
        lines[2].starts_with("pipelock's BPF: ") && lines[2].contains(" · dropped: ")
    };
    ensure!(
        third_whole,
        "the third line is cut or wrong: {:?}\n{screen}",
        lines[2]
    );
    println!("  the first lines at 100 columns:\n    {}", lines.join("\n    "));
    Ok(())
}

/// `pipelock top` as a new user runs it (`auto` picks the mode) in a
/// 100-column tmux window: its first three lines are whole.
fn top_first_lines_are_whole_at_100_columns() -> Result<Outcome> {
    if let Some(skip) = cannot_load() {
        return Ok(skip);
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        return Ok(Outcome::Skipped("tmux is not installed (Debian: tmux)".into()));
    }
    let fentry_refused = mode_refusal("fentry")?.is_some();
    let hooked = !fentry_refused || mode_refusal("kprobe")?.is_none();
    let socket = format!("pipelock-it-100-{}", std::process::id());
    let tmux = |args: &[&str]| -> Result<String> {
        let out = run(Command::new("tmux").args(["-L", &socket]).args(args))?;
        ensure!(out.status.success(), "tmux {args:?}: {}", text(&out.stderr));
        Ok(text(&out.stdout))
    };
    let bin = pipelock_path();
    let shell = format!("{bin} top --interval 0.5 --workload pipe-herd");
    tmux(&["new-session", "-d", "-s", "top", "-x", "100", "-y", "30", &shell])?;
    let result = (|| -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let screen = loop {
            let screen = tmux(&["capture-pane", "-p", "-t", "top"])?;
            if screen.contains("pipe-mutex") {
                break screen;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "no pipe-mutex row after 30 s:\n{screen}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        first_lines_are_whole(&screen, hooked, fentry_refused)?;
        tmux(&["send-keys", "-t", "top", "q"])?;
        Ok(())
    })();
    let _ = tmux(&["kill-server"]);
    result.map(|()| Outcome::Passed)
}
register!(Host top_first_lines_are_whole_at_100_columns);

/// A pseudo-terminal pair: the master end and the slave's path.
fn open_pty(cols: u16, rows: u16) -> Result<(fs::File, PathBuf)> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: plain libc calls on a descriptor we own; ptsname's buffer is
    // copied out before any other call.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        ensure!(master >= 0, "posix_openpt failed");
        ensure!(
            libc::grantpt(master) == 0 && libc::unlockpt(master) == 0,
            "grantpt/unlockpt failed"
        );
        let name = libc::ptsname(master);
        ensure!(!name.is_null(), "ptsname failed");
        let path = PathBuf::from(std::ffi::CStr::from_ptr(name).to_str()?);
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        ensure!(
            libc::ioctl(master, libc::TIOCSWINSZ, &size) == 0,
            "TIOCSWINSZ failed"
        );
        Ok((fs::File::from_raw_fd(master), path))
    }
}
