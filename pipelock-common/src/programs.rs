//! Program names in the eBPF object (the Rust function names of the programs).
//!
//! Each name is declared once in [`programs!`], which also lists them all
//! in [`ALL`]: the integration test `ebpf_object_is_complete` checks that
//! list against the built object both ways, so a program renamed on one
//! side only is caught before anything loads.

/// Declares each program's name as a constant, and [`ALL`] of them.
macro_rules! programs {
    ($($(#[$doc:meta])* $name:ident = $value:literal;)+) => {
        $($(#[$doc])* pub const $name: &str = $value;)+
        /// Every program named here one by one ([`EMPTY_FENTRY`] and
        /// [`EMPTY_FEXIT`] are not).
        pub const ALL: &[&str] = &[$($value),+];
    };
}

programs! {
    /// Classic tracepoint on `lock:contention_begin`, counting events per CPU.
    CONTENTION_BEGIN_COUNT_TP = "contention_begin_count_tp";
    /// The same counter as a BTF-enabled (`tp_btf`) tracepoint program.
    CONTENTION_BEGIN_COUNT_BTF = "contention_begin_count_btf";
    /// `pipelock probe --self-test`: tracepoint mode's interrupt-context check,
    /// judged on syscalls (task context) and softirqs (interrupt context).
    SELFTEST_SYS_ENTER = "selftest_sys_enter";
    SELFTEST_SOFTIRQ_ENTRY = "selftest_softirq_entry";
    /// Empty fentry program: `pipelock probe` loads it to learn whether fentry works.
    PROBE_FENTRY = "probe_fentry";
    /// Empty kprobe program: `pipelock probe` attaches it to learn whether kprobes work.
    PROBE_KPROBE = "probe_kprobe";
    /// Tracepoint-mode pipe lock tracing: `lock:contention_begin` / `_end`,
    /// as tp_btf programs and as classic tracepoint programs.
    PIPE_CONTENTION_BEGIN_BTF = "pipe_contention_begin_btf";
    PIPE_CONTENTION_END_BTF = "pipe_contention_end_btf";
    PIPE_CONTENTION_BEGIN_TP = "pipe_contention_begin_tp";
    PIPE_CONTENTION_END_TP = "pipe_contention_end_tp";

    /// fentry mode: (program, role) for each hook; the kernel function each
    /// attaches to is resolved from kallsyms/BTF by userspace.
    PIPE_READ_ENTRY = "pipe_read_entry";
    PIPE_READ_EXIT = "pipe_read_exit";
    PIPE_WRITE_ENTRY = "pipe_write_entry";
    PIPE_WRITE_EXIT = "pipe_write_exit";
    MUTEX_LOCK_ENTRY = "mutex_lock_entry";
    MUTEX_UNLOCK_ENTRY = "mutex_unlock_entry";
    /// `free_pipe_info`: a pipe is freed, its address may be reused.
    PIPE_FREE_ENTRY = "pipe_free_entry";
    KP_PIPE_FREE_ENTRY = "kp_pipe_free_entry";
    /// splice, tee and vmsplice take pipe locks outside read/write.
    SPLICE_ENTRY = "splice_entry";
    SPLICE_EXIT = "splice_exit";
    TEE_ENTRY = "tee_entry";
    TEE_EXIT = "tee_exit";
    VMSPLICE_ENTRY = "vmsplice_entry";
    VMSPLICE_EXIT = "vmsplice_exit";
    KP_SPLICE_ENTRY = "kp_splice_entry";
    KP_TEE_ENTRY = "kp_tee_entry";
    KP_VMSPLICE_ENTRY = "kp_vmsplice_entry";
    KP_SPLICE_CALL_EXIT = "kp_splice_call_exit";
    SPIN_LOCK_IRQSAVE_ENTRY = "spin_lock_irqsave_entry";
    SPIN_LOCK_IRQSAVE_EXIT = "spin_lock_irqsave_exit";
    SPIN_UNLOCK_IRQRESTORE_ENTRY = "spin_unlock_irqrestore_entry";
    SPIN_LOCK_IRQ_ENTRY = "spin_lock_irq_entry";
    SPIN_LOCK_IRQ_EXIT = "spin_lock_irq_exit";
    SPIN_UNLOCK_IRQ_ENTRY = "spin_unlock_irq_entry";
    /// kprobe mode: one program may attach to several functions.
    KP_PIPE_READ_ENTRY = "kp_pipe_read_entry";
    KP_PIPE_READ_EXIT = "kp_pipe_read_exit";
    KP_PIPE_WRITE_ENTRY = "kp_pipe_write_entry";
    KP_PIPE_WRITE_EXIT = "kp_pipe_write_exit";
    KP_MUTEX_LOCK_ENTRY = "kp_mutex_lock_entry";
    KP_MUTEX_UNLOCK_ENTRY = "kp_mutex_unlock_entry";
    KP_SPIN_LOCK_ENTRY = "kp_spin_lock_entry";
    KP_SPIN_LOCK_EXIT = "kp_spin_lock_exit";
    KP_SPIN_UNLOCK_ENTRY = "kp_spin_unlock_entry";
    /// `sched_process_fork` (tp_btf): a child of a followed process is traced.
    FOLLOW_FORK = "follow_fork";
    /// `sched_process_exit` (tp_btf): an exited process is forgotten.
    FOLLOW_EXIT = "follow_exit";
    /// `lock:contention_begin` in fentry/kprobe mode: marks the task's pending
    /// acquisition as contended.
    HOOKED_CONTENTION_BEGIN = "hooked_contention_begin";
    /// `lock:contention_end` in fentry/kprobe mode: where a contended pipe
    /// mutex acquisition ends (the mutex has no exit hook).
    HOOKED_CONTENTION_END = "hooked_contention_end";
    /// Lockref class, fentry mode: the traceable callers of the notrace
    /// `lockref_*` functions, and the dentry spinlock they fall back to.
    LOCKREF_GET_ENTRY = "lockref_get_entry";
    LOCKREF_GET_EXIT = "lockref_get_exit";
    LOCKREF_PUT_ENTRY = "lockref_put_entry";
    LOCKREF_PUT_EXIT = "lockref_put_exit";
    DENTRY_SPIN_LOCK_ENTRY = "dentry_spin_lock_entry";
    DENTRY_SPIN_LOCK_EXIT = "dentry_spin_lock_exit";
    DENTRY_SPIN_UNLOCK_ENTRY = "dentry_spin_unlock_entry";
    /// The same in kprobe mode (one kretprobe serves both callers).
    KP_LOCKREF_GET_ENTRY = "kp_lockref_get_entry";
    KP_LOCKREF_PUT_ENTRY = "kp_lockref_put_entry";
    KP_LOCKREF_EXIT = "kp_lockref_exit";
    KP_DENTRY_SPIN_LOCK_ENTRY = "kp_dentry_spin_lock_entry";
    KP_DENTRY_SPIN_LOCK_EXIT = "kp_dentry_spin_lock_exit";
    KP_DENTRY_SPIN_UNLOCK_ENTRY = "kp_dentry_spin_unlock_entry";
    EMPTY_KPROBE = "empty_kprobe";
    EMPTY_KRETPROBE = "empty_kretprobe";
    /// Empty `tp_btf` programs on the lock contention tracepoints: tracepoint
    /// mode's floor (the tracepoint's dispatch to a BPF program, and the run-time
    /// statistics' own clock reads), measured beside `pipe_contention_*_btf`.
    EMPTY_CONTENTION_BEGIN = "empty_contention_begin";
    EMPTY_CONTENTION_END = "empty_contention_end";
    /// `sched_switch` and `sched_waking` (tp_btf): a watched lock owner's
    /// state changes (on a CPU, runnable, sleeping).
    HOLDER_SWITCH = "holder_switch";
    HOLDER_WAKING = "holder_waking";
}

/// Programs that do nothing, attached at the same hooks by `pipelock
/// overhead` to measure the attach mechanism's own cost: one fentry/fexit
/// pair per hook (a trampoline program is verified for one function).
pub const EMPTY_FENTRY: [&str; 16] = [
    "empty_fentry_0",
    "empty_fentry_1",
    "empty_fentry_2",
    "empty_fentry_3",
    "empty_fentry_4",
    "empty_fentry_5",
    "empty_fentry_6",
    "empty_fentry_7",
    "empty_fentry_8",
    "empty_fentry_9",
    "empty_fentry_10",
    "empty_fentry_11",
    "empty_fentry_12",
    "empty_fentry_13",
    "empty_fentry_14",
    "empty_fentry_15",
];
pub const EMPTY_FEXIT: [&str; 16] = [
    "empty_fexit_0",
    "empty_fexit_1",
    "empty_fexit_2",
    "empty_fexit_3",
    "empty_fexit_4",
    "empty_fexit_5",
    "empty_fexit_6",
    "empty_fexit_7",
    "empty_fexit_8",
    "empty_fexit_9",
    "empty_fexit_10",
    "empty_fexit_11",
    "empty_fexit_12",
    "empty_fexit_13",
    "empty_fexit_14",
    "empty_fexit_15",
];
