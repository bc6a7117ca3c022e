//! What the programs are told at load time: the kernel's struct offsets
//! (from BTF) and the filters, as one `TraceConfig` global.
use std::path::Path;

use pipelock_common::{TraceConfig, detail, sampling, task_filter};

use super::memory::MapSizes;
use crate::{Error, kernel::KernelBtf, model::ClassSet};

/// What to trace.
#[derive(Clone, Debug, Default)]
pub struct Filters {
    /// Only these processes (`-p`; with `tids`, either).
    pub pids: Vec<u32>,
    /// Only these threads (`-t`).
    pub tids: Vec<u32>,
    /// Only the processes pipelock forks from now on, and theirs: the traced
    /// command's process tree (pipelock itself is not recorded).
    pub follow_children: bool,
    /// Only tasks with this comm.
    pub comm: Option<String>,
    /// The classes to record; empty means [`ClassSet::DEFAULT`].
    pub classes: ClassSet,
    /// How many locks the kernel maps hold per drain (`--max-locks`; None:
    /// the default): not a filter, but refused like one before attaching.
    pub max_locks: Option<u32>,
    /// Record each acquisition's call stack (`--callers`), in a map of
    /// `stack_map_size` stacks (None: the default).
    pub callers: bool,
    pub stack_map_size: Option<u32>,
    /// Past each CPU's exact budget, unwind one call stack in this many
    /// (`--stack-sample`; None: the default, 1: every one).
    pub stack_sample: Option<u32>,
    /// Record each waiting thread's share (`--by task`).
    pub by_task: bool,
    /// Split pipe-mutex holds by what the holder did (`--hold-states`).
    pub hold_states: bool,
}

/// The sparsest stack sample: rarer, and a caller's estimate rests on too
/// few stacks to be worth its margin.
const MAX_STACK_SAMPLE: u32 = 4096;

/// Longest comm the kernel keeps (`TASK_COMM_LEN` - 1).
const COMM_MAX: usize = 15;

impl Filters {
    /// Bad filters are refused before anything is attached, with the reason:
    /// a filter that can match nothing would give an empty report.
    pub fn check(&self) -> Result<(), Error> {
        MapSizes::with_stacks(self.max_locks, self.stack_map_size)?;
        let usage = |why: String| Err(Error::Usage(why));
        if let Some(n) = self.stack_sample.filter(|n| !(1..=MAX_STACK_SAMPLE).contains(n)) {
            return usage(format!(
                "--stack-sample {n}: one stack in N, N from 1 (every one) to {MAX_STACK_SAMPLE}"
            ));
        }
        for (flag, ids, what) in [("-p", &self.pids, "process"), ("-t", &self.tids, "thread")] {
            for &id in ids {
                if id == 0 {
                    return usage(format!("{flag} 0: not a {what} id"));
                }
                // /proc has an entry for every thread id too.
                if !Path::new(&format!("/proc/{id}")).exists() {
                    return usage(format!("{flag} {id}: no such {what}"));
                }
            }
        }
        match self.comm.as_deref() {
            Some("") => usage("-c: the command name is empty".to_owned()),
            Some(comm) if comm.contains('\0') => usage("-c: a command name cannot contain NUL".to_owned()),
            Some(comm) if comm.len() > COMM_MAX => usage(format!(
                "-c {comm}: the kernel keeps {COMM_MAX} bytes of a command name; use `-c {}`",
                comm_prefix(comm)
            )),
            _ => Ok(()),
        }
    }

    /// `TraceConfig::filter_tasks`.
    pub fn task_filter_flags(&self) -> u32 {
        let on = self.follow_children || !self.pids.is_empty() || !self.tids.is_empty();
        let by_tid = !self.tids.is_empty();
        (if on { task_filter::ON } else { 0 }) | (if by_tid { task_filter::BY_TID } else { 0 })
    }

    /// The entries `TASK_FILTER` starts with.
    pub fn task_filter_entries(&self) -> Vec<(u32, u32)> {
        let own = self
            .follow_children
            .then(|| (std::process::id(), task_filter::FOLLOW));
        self.pids
            .iter()
            .map(|&pid| (pid, task_filter::TRACED))
            .chain(self.tids.iter().map(|&tid| (tid, task_filter::THREAD)))
            .chain(own)
            .collect()
    }

    /// `TraceConfig::details`: the breakdowns the programs record. Waits
    /// on the pipe mutex are always split by owner; callers and tasks on
    /// request.
    pub fn details(&self) -> u32 {
        let bit = |on: bool, kind: u32| if on { 1 << kind } else { 0 };
        bit(
            self.classes().contains(crate::model::LockClass::PipeMutex),
            detail::OWNER,
        ) | bit(self.callers, detail::CALLER)
            | bit(self.by_task, detail::TASK)
            | bit(self.hold_states, detail::HOLD)
    }

    /// The classes actually traced.
    pub fn classes(&self) -> ClassSet {
        if self.classes.is_empty() {
            ClassSet::DEFAULT
        } else {
            self.classes
        }
    }
}

/// x86-64 syscall numbers (read, write, readv, writev, splice, tee, vmsplice).
#[cfg(target_arch = "x86_64")]
const SYSCALLS: [u32; 7] = [0, 1, 19, 20, 275, 276, 278];

/// x86-64's kernel stack (`THREAD_SIZE`, 16 KiB since 3.15; KASAN kernels
/// double it, and a doubled stack only makes the interrupt check lenient:
/// an interrupt stack is never inside a task's).
#[cfg(target_arch = "x86_64")]
const THREAD_SIZE: u32 = 16 << 10;

/// Resolves every offset the programs need from the kernel's BTF.
pub fn trace_config(btf: &KernelBtf, filters: &Filters) -> Result<TraceConfig, Error> {
    let off = |t: &str, m: &str| btf.offset_of(t, m);
    // Run-queue locks are named only where a run queue points to itself
    // (`rq->cfs.rq`, CONFIG_FAIR_GROUP_SCHED, which distributions enable).
    let run_queue = (|| {
        let own = off("rq", "cfs").ok()? + off("cfs_rq", "rq").ok()?;
        Some((off("rq", "__lock").ok()?, own, off("rq", "cpu").ok()?))
    })();
    Ok(TraceConfig {
        kiocb_filp: off("kiocb", "ki_filp")?,
        task_files: off("task_struct", "files")?,
        files_fdt: off("files_struct", "fdt")?,
        fdt_max_fds: off("fdtable", "max_fds")?,
        fdt_fd: off("fdtable", "fd")?,
        file_inode: off("file", "f_inode")?,
        file_private_data: off("file", "private_data")?,
        inode_mode: off("inode", "i_mode")?,
        inode_ino: off("inode", "i_ino")?,
        pipe_rd_wait_lock: off("pipe_inode_info", "rd_wait.lock")?,
        pipe_wr_wait_lock: off("pipe_inode_info", "wr_wait.lock")?,
        regs_syscall_nr: off("pt_regs", "orig_ax")?,
        regs_arg0: off("pt_regs", "di")?,
        regs_arg1: off("pt_regs", "si")?,
        regs_arg2: off("pt_regs", "dx")?,
        nr_read: SYSCALLS[0],
        nr_write: SYSCALLS[1],
        nr_readv: SYSCALLS[2],
        nr_writev: SYSCALLS[3],
        nr_splice: SYSCALLS[4],
        nr_tee: SYSCALLS[5],
        nr_vmsplice: SYSCALLS[6],
        task_stack: off("task_struct", "stack")?,
        thread_size: THREAD_SIZE,
        task_group_leader: off("task_struct", "group_leader")?,
        task_comm: off("task_struct", "comm")?,
        filter_tasks: filters.task_filter_flags(),
        task_tgid: off("task_struct", "tgid")?,
        class_mask: filters.classes().mask(),
        path_dentry: off("path", "dentry")?,
        dentry_lockref: off("dentry", "d_lockref.lock")?,
        dentry_name: off("dentry", "d_name.name")?,
        dentry_hash: off("dentry", "d_name.hash_len")?,
        rq_lock: run_queue.map_or(0, |(lock, _, _)| lock),
        rq_self: run_queue.map_or(0, |(_, own, _)| own),
        rq_cpu: run_queue.map_or(0, |(_, _, cpu)| cpu),
        mutex_wait_lock: off("mutex", "wait_lock")?,
        task_pi_lock: off("task_struct", "pi_lock")?,
        task_pid: off("task_struct", "pid")?,
        mutex_owner: off("mutex", "owner")?,
        task_on_cpu: off("task_struct", "on_cpu")?,
        task_state: off("task_struct", "__state")?,
        details: filters.details(),
        filter_comm_set: u32::from(filters.comm.is_some()),
        filter_comm: comm_bytes(filters.comm.as_deref().unwrap_or(""))?,
        // Set by the caller, which knows the kernel's preemption model.
        runs_unpreempted: 0,
        btf_file: btf.struct_id("file")?,
        btf_inode: btf.struct_id("inode")?,
        btf_kiocb: btf.struct_id("kiocb")?,
        btf_mutex: btf.struct_id("mutex")?,
        btf_task: btf.struct_id("task_struct")?,
        btf_pt_regs: btf.struct_id("pt_regs")?,
        stacks_exact: sampling::EXACT_PER_INTERVAL,
        stack_sample: filters.stack_sample.unwrap_or(sampling::DEFAULT_SAMPLE),
    })
}

/// The first 15 bytes of `comm`, cut at a character boundary.
fn comm_prefix(comm: &str) -> &str {
    let mut end = COMM_MAX.min(comm.len());
    while !comm.is_char_boundary(end) {
        end -= 1;
    }
    &comm[..end]
}

/// A `-c COMM` as the kernel stores it: NUL-padded ([`Filters::check`]
/// refuses names the kernel could not hold).
fn comm_bytes(comm: &str) -> Result<[u8; 16], Error> {
    if comm.contains('\0') || comm.len() > COMM_MAX {
        return Err(Error::Usage(format!(
            "-c {comm}: not a command name the kernel can hold"
        )));
    }
    let mut bytes = [0u8; 16];
    bytes[..comm.len()].copy_from_slice(comm.as_bytes());
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{kernel::KernelInspector, model::LockClass};

    #[test]
    fn config_carries_the_fixture_kernels_offsets_and_the_filters() {
        let btf = KernelInspector::at(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernels/debian-6.1.0-57"),
        )
        .btf()
        .unwrap();
        let filters = Filters {
            pids: vec![42],
            tids: vec![43],
            comm: Some("cat".into()),
            classes: ClassSet::PIPE_WAIT,
            ..Filters::default()
        };
        let config = trace_config(&btf, &filters).unwrap();
        assert_eq!((config.file_private_data, config.dentry_lockref), (200, 88));
        assert_eq!((config.pipe_rd_wait_lock, config.pipe_wr_wait_lock), (32, 56));
        assert_eq!(config.filter_tasks, task_filter::ON | task_filter::BY_TID);
        assert_eq!(
            filters.task_filter_entries(),
            [(42, task_filter::TRACED), (43, task_filter::THREAD)]
        );
        assert_eq!(config.task_tgid, 2420, "6.1's task_struct.tgid (kernel-facts.md)");
        // x86-64 pt_regs: di, si, dx; splice's fds are its 1st and 3rd arguments.
        assert_eq!(
            (config.regs_arg0, config.regs_arg1, config.regs_arg2),
            (112, 104, 96)
        );
        assert_eq!(
            (config.nr_splice, config.nr_tee, config.nr_vmsplice),
            (275, 276, 278)
        );
        assert_eq!(config.thread_size, 16 << 10);
        assert_eq!(
            (config.rq_lock, config.rq_self > config.rq_lock, config.rq_cpu > 0),
            (0, true, true),
            "6.1's struct rq starts with its lock and points to itself through cfs.rq"
        );
        assert!(config.task_pi_lock > 0 && config.task_pid > 0);
        assert!(config.task_stack > 0 && config.task_comm > config.task_group_leader);
        assert_eq!(&config.filter_comm[..4], b"cat\0");
        assert_eq!(config.class_mask, ClassSet::PIPE_WAIT.mask());
        let default = trace_config(&btf, &Filters::default()).unwrap();
        assert_eq!(default.class_mask, ClassSet::DEFAULT.mask());
        assert_eq!(
            default.class_mask & (1 << LockClass::Lockref.id()),
            0,
            "lockref is opt-in"
        );
        assert!(
            trace_config(
                &btf,
                &Filters {
                    comm: Some("a\0b".into()),
                    ..Filters::default()
                }
            )
            .is_err()
        );
    }
}

#[cfg(test)]
mod filter_tests {
    use super::*;

    #[test]
    fn filters_that_match_nothing_are_refused_by_name() {
        let check = |f: Filters| f.check().map_err(|e| e.to_string());
        let me = std::process::id();
        assert_eq!(check(Filters::default()), Ok(()));
        assert_eq!(
            check(Filters {
                pids: vec![me],
                ..Filters::default()
            }),
            Ok(())
        );
        for (filters, says) in [
            (
                Filters {
                    pids: vec![0],
                    ..Filters::default()
                },
                "-p 0: not a process id",
            ),
            (
                Filters {
                    pids: vec![me, u32::MAX - 1],
                    ..Filters::default()
                },
                "no such process",
            ),
            (
                Filters {
                    tids: vec![u32::MAX - 1],
                    ..Filters::default()
                },
                "-t 4294967294: no such thread",
            ),
            (
                Filters {
                    comm: Some(String::new()),
                    ..Filters::default()
                },
                "-c: the command name is empty",
            ),
            (
                Filters {
                    comm: Some("a-very-long-command".into()),
                    ..Filters::default()
                },
                "use `-c a-very-long-com`",
            ),
        ] {
            let err = check(filters).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        assert_eq!(comm_prefix("ééééééééé"), "ééééééé", "cut at a character boundary");
    }

    #[test]
    fn following_the_command_marks_pipelock_as_a_parent_only() {
        let follow = Filters {
            follow_children: true,
            ..Filters::default()
        };
        assert_eq!(follow.task_filter_flags(), task_filter::ON);
        assert_eq!(
            follow.task_filter_entries(),
            [(std::process::id(), task_filter::FOLLOW)]
        );
        assert_eq!(Filters::default().task_filter_flags(), 0, "system-wide");
    }
}
