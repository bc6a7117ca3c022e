//! Program names in the eBPF object (the Rust function names of the programs).

/// Classic tracepoint on `lock:contention_begin`, counting events per CPU.
pub const CONTENTION_BEGIN_COUNT_TP: &str = "contention_begin_count_tp";
/// The same counter as a BTF-enabled (`tp_btf`) tracepoint program.
pub const CONTENTION_BEGIN_COUNT_BTF: &str = "contention_begin_count_btf";
/// `pipelock probe --self-test`: tracepoint mode's interrupt-context check,
/// judged on syscalls (task context) and softirqs (interrupt context).
pub const SELFTEST_SYS_ENTER: &str = "selftest_sys_enter";
pub const SELFTEST_SOFTIRQ_ENTRY: &str = "selftest_softirq_entry";
/// Empty fentry program: `pipelock probe` loads it to learn whether fentry works.
pub const PROBE_FENTRY: &str = "probe_fentry";
/// Empty kprobe program: `pipelock probe` attaches it to learn whether kprobes work.
pub const PROBE_KPROBE: &str = "probe_kprobe";
/// Tracepoint-mode pipe lock tracing: `lock:contention_begin` / `_end`,
/// as tp_btf programs and as classic tracepoint programs.
pub const PIPE_CONTENTION_BEGIN_BTF: &str = "pipe_contention_begin_btf";
pub const PIPE_CONTENTION_END_BTF: &str = "pipe_contention_end_btf";
pub const PIPE_CONTENTION_BEGIN_TP: &str = "pipe_contention_begin_tp";
pub const PIPE_CONTENTION_END_TP: &str = "pipe_contention_end_tp";

/// fentry mode: (program, role) for each hook; the kernel function each
/// attaches to is resolved from kallsyms/BTF by userspace.
pub const PIPE_READ_ENTRY: &str = "pipe_read_entry";
pub const PIPE_READ_EXIT: &str = "pipe_read_exit";
pub const PIPE_WRITE_ENTRY: &str = "pipe_write_entry";
pub const PIPE_WRITE_EXIT: &str = "pipe_write_exit";
pub const MUTEX_LOCK_ENTRY: &str = "mutex_lock_entry";
pub const MUTEX_UNLOCK_ENTRY: &str = "mutex_unlock_entry";
/// `free_pipe_info`: a pipe is freed, its address may be reused.
pub const PIPE_FREE_ENTRY: &str = "pipe_free_entry";
pub const KP_PIPE_FREE_ENTRY: &str = "kp_pipe_free_entry";
/// splice, tee and vmsplice take pipe locks outside read/write.
pub const SPLICE_ENTRY: &str = "splice_entry";
pub const SPLICE_EXIT: &str = "splice_exit";
pub const TEE_ENTRY: &str = "tee_entry";
pub const TEE_EXIT: &str = "tee_exit";
pub const VMSPLICE_ENTRY: &str = "vmsplice_entry";
pub const VMSPLICE_EXIT: &str = "vmsplice_exit";
pub const KP_SPLICE_ENTRY: &str = "kp_splice_entry";
pub const KP_TEE_ENTRY: &str = "kp_tee_entry";
pub const KP_VMSPLICE_ENTRY: &str = "kp_vmsplice_entry";
pub const KP_SPLICE_CALL_EXIT: &str = "kp_splice_call_exit";
pub const SPIN_LOCK_IRQSAVE_ENTRY: &str = "spin_lock_irqsave_entry";
pub const SPIN_LOCK_IRQSAVE_EXIT: &str = "spin_lock_irqsave_exit";
pub const SPIN_UNLOCK_IRQRESTORE_ENTRY: &str = "spin_unlock_irqrestore_entry";
pub const SPIN_LOCK_IRQ_ENTRY: &str = "spin_lock_irq_entry";
pub const SPIN_LOCK_IRQ_EXIT: &str = "spin_lock_irq_exit";
pub const SPIN_UNLOCK_IRQ_ENTRY: &str = "spin_unlock_irq_entry";
/// kprobe mode: one program may attach to several functions.
pub const KP_PIPE_READ_ENTRY: &str = "kp_pipe_read_entry";
pub const KP_PIPE_READ_EXIT: &str = "kp_pipe_read_exit";
pub const KP_PIPE_WRITE_ENTRY: &str = "kp_pipe_write_entry";
pub const KP_PIPE_WRITE_EXIT: &str = "kp_pipe_write_exit";
pub const KP_MUTEX_LOCK_ENTRY: &str = "kp_mutex_lock_entry";
pub const KP_MUTEX_UNLOCK_ENTRY: &str = "kp_mutex_unlock_entry";
pub const KP_SPIN_LOCK_ENTRY: &str = "kp_spin_lock_entry";
pub const KP_SPIN_LOCK_EXIT: &str = "kp_spin_lock_exit";
pub const KP_SPIN_UNLOCK_ENTRY: &str = "kp_spin_unlock_entry";
/// `sched_process_fork` (tp_btf): a child of a followed process is traced.
pub const FOLLOW_FORK: &str = "follow_fork";
/// `sched_process_exit` (tp_btf): an exited process is forgotten.
pub const FOLLOW_EXIT: &str = "follow_exit";
/// `lock:contention_begin` in fentry/kprobe mode: marks the task's pending
/// acquisition as contended.
pub const HOOKED_CONTENTION_BEGIN: &str = "hooked_contention_begin";
/// `lock:contention_end` in fentry/kprobe mode: where a contended pipe
/// mutex acquisition ends (the mutex has no exit hook).
pub const HOOKED_CONTENTION_END: &str = "hooked_contention_end";
/// Lockref class, fentry mode: the traceable callers of the notrace
/// `lockref_*` functions, and the dentry spinlock they fall back to.
pub const LOCKREF_GET_ENTRY: &str = "lockref_get_entry";
pub const LOCKREF_GET_EXIT: &str = "lockref_get_exit";
pub const LOCKREF_PUT_ENTRY: &str = "lockref_put_entry";
pub const LOCKREF_PUT_EXIT: &str = "lockref_put_exit";
pub const DENTRY_SPIN_LOCK_ENTRY: &str = "dentry_spin_lock_entry";
pub const DENTRY_SPIN_LOCK_EXIT: &str = "dentry_spin_lock_exit";
pub const DENTRY_SPIN_UNLOCK_ENTRY: &str = "dentry_spin_unlock_entry";
/// The same in kprobe mode (one kretprobe serves both callers).
pub const KP_LOCKREF_GET_ENTRY: &str = "kp_lockref_get_entry";
pub const KP_LOCKREF_PUT_ENTRY: &str = "kp_lockref_put_entry";
pub const KP_LOCKREF_EXIT: &str = "kp_lockref_exit";
pub const KP_DENTRY_SPIN_LOCK_ENTRY: &str = "kp_dentry_spin_lock_entry";
pub const KP_DENTRY_SPIN_LOCK_EXIT: &str = "kp_dentry_spin_lock_exit";
pub const KP_DENTRY_SPIN_UNLOCK_ENTRY: &str = "kp_dentry_spin_unlock_entry";
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
pub const EMPTY_KPROBE: &str = "empty_kprobe";
pub const EMPTY_KRETPROBE: &str = "empty_kretprobe";
/// Empty `tp_btf` programs on the lock contention tracepoints: tracepoint
/// mode's floor (the tracepoint's dispatch to a BPF program, and the run-time
/// statistics' own clock reads), measured beside `pipe_contention_*_btf`.
pub const EMPTY_CONTENTION_BEGIN: &str = "empty_contention_begin";
pub const EMPTY_CONTENTION_END: &str = "empty_contention_end";
/// `sched_switch` and `sched_waking` (tp_btf): a watched lock owner's
/// state changes (on a CPU, runnable, sleeping).
pub const HOLDER_SWITCH: &str = "holder_switch";
pub const HOLDER_WAKING: &str = "holder_waking";
