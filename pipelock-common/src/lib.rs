//! Types and names shared by pipelock's eBPF programs and its userspace.
//!
//! Everything here is `#[repr(C)]` and plain data: the kernel side writes it into
//! maps, the userspace side reads the same bytes back. The `user` feature adds
//! the `aya::Pod` impls userspace needs to read them.
#![no_std]

pub mod asked_twice;
mod cpu_local;
mod details;
mod drops;
pub mod loglinear;
pub mod maps;
pub mod programs;
mod stats;
pub mod summary;

pub use cpu_local::{CPU_LOCAL_LOCKS, CPU_LOCAL_PARTS, CpuLocalDetails, CpuLocalStats};
pub use details::{
    DetailKey, DetailStats, HolderClock, NO_STACK, STACK_FRAMES, TaskName, detail, holder, sampling,
};
pub use drops::Drop;
pub use stats::{BucketCount, Histogram, LockStats};

/// Values of `TASK_FILTER` (bits), and of `TraceConfig::filter_tasks`.
pub mod task_filter {
    /// Key is a process id whose tasks are recorded (`-p`, the traced command).
    pub const TRACED: u32 = 1;
    /// Key is a process id whose children get `TRACED | FOLLOW` when forked:
    /// how `trace -- COMMAND` follows COMMAND's process tree.
    pub const FOLLOW: u32 = 2;
    /// Key is a thread id that is recorded (`-t`).
    pub const THREAD: u32 = 4;
    /// In `filter_tasks`: filter by `TASK_FILTER`.
    pub const ON: u32 = 1;
    /// In `filter_tasks`: also look threads up by thread id.
    pub const BY_TID: u32 = 2;
}

/// The immediate of every `bpf_rdonly_cast` kfunc call in the object, as
/// compiled. The aya 0.14 loader relocates no kfunc calls, so userspace
/// writes the kfunc's BTF id over this mark before loading (or, on a
/// kernel without the kfunc, turns the call into `r0 = 0`).
pub const RDONLY_CAST_MARK: u32 = 0x7a11_ca57;

/// The same for `bpf_preempt_disable` and `bpf_preempt_enable` (6.10+),
/// which a fentry/fexit program's body runs between; on a kernel without
/// them both calls become `r0 = 0`.
pub const PREEMPT_DISABLE_MARK: u32 = 0x7a11_ca58;
pub const PREEMPT_ENABLE_MARK: u32 = 0x7a11_ca59;

/// Name of the global holding the [`TraceConfig`] (set by userspace at load).
pub const TRACE_CONFIG_GLOBAL: &str = "TRACE_CONFIG";

/// Lock classes, as stored in maps.
pub mod class {
    /// `pipe->mutex` (at offset 0 of `pipe_inode_info`).
    pub const PIPE_MUTEX: u32 = 1;
    /// `pipe->rd_wait.lock`.
    pub const PIPE_RD_WAIT: u32 = 2;
    /// `pipe->wr_wait.lock`.
    pub const PIPE_WR_WAIT: u32 = 3;
    /// Another lock, contended by a task inside read/write on a pipe
    /// (scheduler run-queue and `pi_lock`s of the wake-up path, mostly).
    pub const OTHER_IN_PIPE_CALL: u32 = 4;
    /// `dentry->d_lockref`, measured at the callers of `lockref_*`.
    pub const LOCKREF: u32 = 5;
}

/// `LCB_F_MUTEX`: a mutex, whose one acquisition may emit several begins.
pub const LCB_F_MUTEX: u32 = 0x20;

/// `LCB_F_SPIN` of `lock:contention_begin`: the waiter spins (optimistic
/// spinning on a mutex, or a spinlock).
pub const LCB_F_SPIN: u32 = 0x1;

/// Kernel struct offsets and filters, resolved by userspace from the running
/// kernel's BTF and handed to the programs as a global at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceConfig {
    /// `kiocb.ki_filp` (fentry mode: the pipe of a pipe_read/pipe_write call).
    pub kiocb_filp: u32,
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_inode: u32,
    pub file_private_data: u32,
    pub inode_mode: u32,
    pub inode_ino: u32,
    /// `pipe_inode_info.rd_wait` + `wait_queue_head.lock`.
    pub pipe_rd_wait_lock: u32,
    pub pipe_wr_wait_lock: u32,
    /// `pt_regs.orig_ax`, `.di`, `.si`, `.dx` (the syscall number and first
    /// three arguments).
    pub regs_syscall_nr: u32,
    pub regs_arg0: u32,
    pub regs_arg1: u32,
    pub regs_arg2: u32,
    /// Syscall numbers of read, write, readv, writev, splice, tee and vmsplice
    /// on this architecture.
    pub nr_read: u32,
    pub nr_write: u32,
    pub nr_readv: u32,
    pub nr_writev: u32,
    pub nr_splice: u32,
    pub nr_tee: u32,
    pub nr_vmsplice: u32,
    /// `task_struct.stack` and the kernel stack's size: a `tp_btf` event
    /// whose arguments are not on the current task's stack runs on an
    /// interrupt stack, on top of whatever task it interrupted.
    pub task_stack: u32,
    pub thread_size: u32,
    /// `task_struct.group_leader` and `.comm`: `-c` matches an io_uring
    /// worker (`iou-wrk-PID`) by its process's command name.
    pub task_group_leader: u32,
    pub task_comm: u32,
    /// Which tasks to record: 0 all, else those `TASK_FILTER` marks
    /// ([`task_filter`]); with [`task_filter::BY_TID`] set, threads are looked
    /// up by thread id too.
    pub filter_tasks: u32,
    /// `task_struct.tgid`: a forked child's process id.
    pub task_tgid: u32,
    /// Bit `1 << class` set for each class to record.
    pub class_mask: u32,
    /// `path.dentry`, `dentry.d_lockref.lock`, `dentry.d_name.name`,
    /// `dentry.d_name.hash_len`.
    pub path_dentry: u32,
    pub dentry_lockref: u32,
    pub dentry_name: u32,
    pub dentry_hash: u32,
    /// `rq.__lock`; `rq.cfs.rq`, the run queue's pointer to itself (0: the
    /// kernel has none, run-queue locks are not recognised); `rq.cpu`.
    pub rq_lock: u32,
    pub rq_self: u32,
    pub rq_cpu: u32,
    /// `mutex.wait_lock` (the spinlock inside a pipe's mutex).
    pub mutex_wait_lock: u32,
    /// `task_struct.pi_lock` and `task_struct.pid`.
    pub task_pi_lock: u32,
    pub task_pid: u32,
    /// `mutex.owner` (the owning task, flags in its low 3 bits);
    /// `task_struct.on_cpu` and `.__state`: what an owner is doing when a
    /// waiter starts watching it.
    pub mutex_owner: u32,
    pub task_on_cpu: u32,
    pub task_state: u32,
    /// Bits `1 << detail::…` of the breakdowns to record ([`DetailKey`]).
    pub details: u32,
    /// Non-zero: only tasks whose comm is `filter_comm` (NUL-padded).
    pub filter_comm_set: u32,
    pub filter_comm: [u8; 16],
    /// Non-zero: a fentry program's body runs to its end once started (the
    /// kernel preempts no kernel code, `none` or `voluntary` preemption, or
    /// the body runs between `bpf_preempt_disable` and `_enable`), so a
    /// mutex release may update this CPU's local table with plain adds.
    pub runs_unpreempted: u32,
    /// BTF type ids of `struct file`, `inode`, `mutex` and `task_struct` in
    /// the kernel's BTF, for `bpf_rdonly_cast`: a kernel address cast to
    /// one reads its members with plain loads. Unused where userspace
    /// replaced the kfunc call (a kernel without it: before 6.2).
    pub btf_file: u32,
    pub btf_inode: u32,
    /// `struct kiocb`: its `ki_filp` is a `struct file *`, so an fd
    /// array's slot `fd[n]` reads as a typed file pointer when the slot's
    /// address less `kiocb_filp` is cast to a kiocb.
    pub btf_kiocb: u32,
    pub btf_mutex: u32,
    pub btf_task: u32,
    /// `struct pt_regs`: a thread's user registers, cached by address.
    pub btf_pt_regs: u32,
    /// Call stacks (`--callers`): each CPU unwinds the first
    /// `stacks_exact` of an interval, then one in `stack_sample` at random
    /// (1: every one); see [`sampling`].
    pub stacks_exact: u32,
    pub stack_sample: u32,
}

/// A contended acquisition in progress (`lock` 0: a free entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub lock: u64,
    /// [`LockKey::owner`] of the lock, learnt at the first begin.
    pub owner: u64,
    pub start_ns: u64,
    pub class: u32,
    /// OR of the flags of every `contention_begin` of this acquisition.
    pub flags_or: u32,
    /// AND of them: without `LCB_F_SPIN` the waiter went to sleep at least once.
    pub flags_and: u32,
    /// A mutex's owner when the wait began: its thread id and `task_struct`
    /// (0: unknown), and its [`HolderClock`] when the waiter went to sleep.
    pub owner_tid: u32,
    pub owner_task: u64,
    pub holder_at_start: [u64; holder::STATES],
    /// 1 while `owner_task` is watched (from the first begin that sleeps:
    /// a waiter that only spins needs no watching, see `probes::holder`).
    pub watched: u32,
}

/// Waits one thread can have open at once: a mutex wait, the slow path's
/// `wait_lock` spin inside it, and an interrupt's spin on top.
pub const OPEN_WAITS: usize = 3;

/// Tracepoint mode: a thread's contended acquisitions in progress, thread
/// `tid` at slot `tid % TASK_SLOTS` of `TASK_WAITS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskWaits {
    pub waits: [Pending; OPEN_WAITS],
    /// Whether the thread is traced (`-p`, `-t`, the followed command),
    /// judged when it took the slot (again on every wait with `-c`).
    pub wanted: u32,
    /// The collection interval `recorded` belongs to (`STATS_SLOT`'s count).
    pub recorded_in: u32,
    /// The locks this thread named in `LOCK_INFO` and recorded itself on in
    /// `LOCK_USERS` in that interval, so it looks them up once per interval:
    /// a waiter comes back to the same few locks (a herd's writer: the pipe's
    /// mutex and `rd_wait.lock`, and each CPU's run-queue lock).
    pub recorded: [LockKey; RECORDED],
    /// Where the next lock goes in `recorded` (round robin).
    pub recorded_next: u32,
    pub _pad: u32,
    /// The thread's `task_struct` (with [`ThreadSlot::owner`], who the slot
    /// is for: a thread id reused in the same process is another task).
    pub task: u64,
    /// Where its user registers are (`task_pt_regs`, fixed for the task's
    /// life: the top of its kernel stack), so a begin reads the syscall
    /// without a helper call.
    pub regs: u64,
}

/// Locks a thread remembers recording per interval ([`TaskWaits::recorded`]).
pub const RECORDED: usize = 4;

/// Index of a pipe's locks in [`TaskPipe`]'s arrays: lock `l` of the call's
/// pipe `p` (0 or 1: `splice` and `tee` between two pipes hold both) is at
/// `p * COUNT + l`.
pub mod pipe_lock {
    pub const MUTEX: usize = 0;
    pub const RD_WAIT: usize = 1;
    pub const WR_WAIT: usize = 2;
    pub const COUNT: usize = 3;
    /// Pipes one call can lock.
    pub const PIPES: usize = 2;
    /// Entries of [`super::TaskPipe`]'s per-lock arrays.
    pub const SLOTS: usize = PIPES * COUNT;
}

/// Slots of `TASK_PIPE` and `TASK_WAITS`, a thread's at `tid % TASK_SLOTS`
/// (a power of two).
pub const TASK_SLOTS: u32 = 16384;

/// A slot of `TASK_PIPE` or `TASK_WAITS`. Threads whose ids are
/// `TASK_SLOTS` apart share it, and a program can be interrupted on its CPU
/// by another that looks up the same thread's slot: a program reads or
/// writes `value` (and writes `owner`) only after turning `taken` from 0
/// to 1 with one compare-and-swap, and sets it back to 0 when done. A
/// program that finds it taken leaves the event out (counted as
/// `slot_busy` when another thread holds it; a program nested in the
/// thread's own sees BPF's or an interrupt's locks, not the call's).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadSlot<T> {
    /// The thread (`pid_tgid`) the slot is for; 0: never used. Read
    /// without taking the slot, as a hint only (checked again once taken).
    pub owner: u64,
    pub taken: u64,
    pub value: T,
}

/// Hooked modes: a task inside a pipe call (read/write, splice, tee,
/// vmsplice), and where each of its pipes' locks stands for it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskPipe {
    /// The call's pipes (`pipe_inode_info`, whose mutex is at offset 0); 0
    /// for none (outside a call, or the second pipe of a one-pipe call).
    pub pipe: [u64; pipe_lock::PIPES],
    /// Their inode numbers: the [`LockKey::owner`] of their locks.
    pub ino: [u64; pipe_lock::PIPES],
    /// A read/write's `struct kiocb`: its file (pipe, inode number) is read
    /// only on the thread's first call on a pipe, not on every call.
    pub kiocb: u64,
    /// When the lock call started (0: not in a lock call).
    pub wait_start: [u64; pipe_lock::SLOTS],
    /// When the lock was acquired (0: not held by this task).
    pub hold_start: [u64; pipe_lock::SLOTS],
    /// The wait of the current acquisition, recorded with its hold at the
    /// release (one statistics lookup per lock/unlock pair).
    pub wait_ns: [u64; pipe_lock::SLOTS],
    /// A `contention_begin` was seen during the current lock call.
    pub contended: [u32; pipe_lock::SLOTS],
    /// AND of those begins' flags (`LCB_F_SPIN` kept: it only spun).
    pub flags_and: [u32; pipe_lock::SLOTS],
    /// The lock call's stack in `STACKS` ([`NO_STACK`]: none).
    pub stack_id: [u32; pipe_lock::SLOTS],
    /// Bit `1 << index`: that lock has its `LOCK_INFO` entry (bits 0..3 are
    /// kept across read/write calls on `noted_pipe`).
    pub registered: u32,
    /// Bit `p` set while pipe `p`'s mutex owner (`owner_task`) is watched:
    /// from the waiter's first begin that sleeps.
    pub owner_watched: u32,
    /// The pipe this thread's read/write calls were last recorded on in
    /// `LOCK_USERS`, and its inode number.
    pub noted_pipe: u64,
    pub noted_ino: u64,
    /// `PIPE_FREES` when `noted_pipe` was checked: once any pipe has been
    /// freed since, the address may now be another pipe's, and is checked again.
    pub frees_seen: u64,
    /// A contended mutex acquisition of each pipe: its owner when the wait
    /// began (thread id and `task_struct`, 0: unknown) and the owner's
    /// [`HolderClock`] when the waiter went to sleep.
    pub owner_tid: [u32; pipe_lock::PIPES],
    pub owner_task: [u64; pipe_lock::PIPES],
    pub holder_at_start: [[u64; holder::STATES]; pipe_lock::PIPES],
    pub _pad: u32,
    /// `--hold-states`: bit `p` set while this thread's hold of pipe `p`'s
    /// mutex is watched, its [`HolderClock`] at the hold's start.
    pub hold_watched: u32,
    pub hold_at_start: [[u64; holder::STATES]; pipe_lock::PIPES],
}

/// What a traced lock belongs to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockInfo {
    /// The `pipe_inode_info` the lock belongs to (or was contended inside).
    pub pipe: u64,
    /// The pipe's inode number: `pipe:[ino]` in /proc/PID/fd.
    pub ino: u64,
    pub class: u32,
    /// Other-in-pipe-call: what the lock was recognised as ([`known`]).
    pub known: u32,
    /// Lockref class: the dentry's name (NUL-padded, truncated to fit);
    /// a task's `pi_lock`: the task's comm.
    pub name: [u8; 32],
    /// A run queue's CPU, a task's thread id.
    pub detail: u64,
}

/// What an other-in-pipe-call lock was recognised as ([`LockInfo::known`]),
/// each checked against the kernel object around it before it is believed.
pub mod known {
    pub const NOTHING: u32 = 0;
    /// `rq->__lock` of the run queue of CPU `detail`.
    pub const RUN_QUEUE: u32 = 1;
    /// `task->pi_lock` of thread `detail`, comm `name`.
    pub const TASK_PI: u32 = 2;
    /// The `wait_lock` inside the pipe's own mutex (its slow path's spinlock).
    pub const PIPE_MUTEX_WAIT_LOCK: u32 = 3;
}

/// fentry/kprobe mode: a task inside a lockref caller (`__legitimize_path`,
/// `dput`) and its fallback to the dentry spinlock.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskLockref {
    /// `&dentry->d_lockref` (its spinlock is at offset 0).
    pub lockref: u64,
    pub dentry: u64,
    /// When the outermost caller was entered.
    pub start: u64,
    /// When `spin_lock` on the lockref's lock was called (0: not in it).
    pub spin_start: u64,
    /// When that spinlock was acquired (0: not held).
    pub hold_start: u64,
    /// `d_name.hash_len` at entry: the [`LockKey::owner`] of this lockref.
    pub owner: u64,
    /// Nested caller calls (a `dput` inside a `dput`): only the outermost is timed.
    pub depth: u32,
    /// The call fell back to the spinlock.
    pub fell_back: u32,
}

/// One lock instance: its address, and what it belongs to at that address.
/// Freed memory is handed out again (a new pipe often lands where a dead
/// one was), so the address alone would merge unrelated locks into one row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub lock: u64,
    /// The pipe's inode number for a pipe's locks and for other locks
    /// contended inside its calls; the dentry's name hash (`d_name.hash_len`)
    /// for a lockref.
    pub owner: u64,
}

/// Key of `LOCK_USERS`: a process seen contending a lock.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LockUser {
    pub key: LockKey,
    pub tgid: u32,
    pub _pad: u32,
}

/// The tracepoint the self-test counts: category and name as tracefs spells them.
pub const CONTENTION_BEGIN_TRACEPOINT: (&str, &str) = ("lock", "contention_begin");

#[cfg(feature = "user")]
mod user {
    // SAFETY (all): `#[repr(C)]`, integer fields only, explicit padding
    // fields, so no uninitialised bytes and every bit pattern is valid.
    unsafe impl aya::Pod for super::Histogram {}
    unsafe impl aya::Pod for super::TraceConfig {}
    unsafe impl aya::Pod for super::Pending {}
    unsafe impl aya::Pod for super::LockStats {}
    unsafe impl aya::Pod for super::CpuLocalStats {}
    unsafe impl aya::Pod for super::CpuLocalDetails {}
    unsafe impl aya::Pod for super::LockInfo {}
    unsafe impl aya::Pod for super::LockUser {}
    unsafe impl aya::Pod for super::LockKey {}
    unsafe impl aya::Pod for super::TaskWaits {}
    unsafe impl aya::Pod for super::TaskPipe {}
    unsafe impl aya::Pod for super::TaskLockref {}
    unsafe impl aya::Pod for super::HolderClock {}
    unsafe impl aya::Pod for super::DetailKey {}
    unsafe impl aya::Pod for super::DetailStats {}
    unsafe impl aya::Pod for super::TaskName {}
    unsafe impl aya::Pod for super::asked_twice::AskedKey {}
    unsafe impl aya::Pod for super::asked_twice::AskedTwice {}
}
