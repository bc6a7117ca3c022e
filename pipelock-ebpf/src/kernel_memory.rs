//! Reads of kernel memory through `bpf_probe_read_kernel`, for pointers the
//! verifier does not know the type of (see `btf_ptr` for the typed ones).
use aya_ebpf::helpers::bpf_probe_read_kernel;

#[inline(always)]
pub(crate) fn read<T>(address: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address and fails cleanly.
    unsafe { bpf_probe_read_kernel(address as *const T).ok() }
}

/// Two 8-byte-aligned words of one kernel object, `first` and `second`
/// bytes into it (the lower bits hold a smaller field: little endian), in
/// one read where they are close: a helper call costs more than the bytes
/// it copies. A window that cannot be read (the object ends before it)
/// falls back to two reads.
#[inline(always)]
pub(crate) fn read_words(base: u64, first: u32, second: u32) -> Option<(u64, u64)> {
    let low = if first < second { first } else { second };
    let (a, b) = (((first - low) / 8) as usize, ((second - low) / 8) as usize);
    let aligned = first % 8 == 0 && second % 8 == 0;
    if aligned && a < 2 && b < 2 {
        if let Some(words) = read::<[u64; 2]>(base + low as u64) {
            return Some((*words.get(a)?, *words.get(b)?));
        }
    } else if aligned
        && a < 9
        && b < 9
        && let Some(words) = read::<[u64; 9]>(base + low as u64)
    {
        return Some((*words.get(a)?, *words.get(b)?));
    }
    Some((
        read::<u64>(base + first as u64)?,
        read::<u64>(base + second as u64)?,
    ))
}
