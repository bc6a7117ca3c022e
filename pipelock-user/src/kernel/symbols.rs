//! Kernel addresses as names: `/proc/kallsyms` with its addresses (root
//! sees them; others read zeros), sorted for lookups. Code addresses become
//! `anon_pipe_write+0x50` (call stacks), data addresses `jiffies_lock+0x8`
//! (static locks; data symbols are there only with `CONFIG_KALLSYMS_ALL`,
//! which distributions enable and this project's development host lacks).
use std::collections::HashMap;

/// Whether a symbol is code or data, by its kallsyms type letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolKind {
    Code,
    Data,
}

impl SymbolKind {
    fn of(letter: &str) -> Option<Self> {
        match letter {
            "t" | "T" | "w" | "W" => Some(Self::Code),
            "d" | "D" | "b" | "B" | "r" | "R" => Some(Self::Data),
            _ => None,
        }
    }
}

/// Sorted kernel symbols (modules included, per-CPU offsets left out: they
/// are not addresses).
#[derive(Clone, Debug, Default)]
pub struct KernelSymbols {
    /// (address, kind, name), by address; names interned.
    symbols: Vec<(u64, SymbolKind, u32)>,
    names: Vec<Box<str>>,
    /// Whether data symbols are listed (`CONFIG_KALLSYMS_ALL`).
    has_data: bool,
}

/// Past the last symbol of a kind nothing is named beyond this: the end of
/// the last object is not known.
const LAST_SYMBOL_SPAN: u64 = 1 << 16;
/// No static object holding a lock is larger than this: an address further
/// into a data symbol is in a gap between symbols kallsyms does not list.
const DATA_SPAN: u64 = 1 << 16;
/// Fewer data symbols than this: a kernel without `CONFIG_KALLSYMS_ALL`,
/// whose few data symbols are section markers with huge gaps after them.
const MIN_DATA_SYMBOLS: usize = 1000;

impl KernelSymbols {
    pub fn parse(text: &str) -> Self {
        let mut interned: HashMap<&str, u32> = HashMap::new();
        let mut names: Vec<Box<str>> = Vec::new();
        let mut symbols = Vec::new();
        for line in text.lines() {
            let mut fields = line.split_ascii_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            let (Ok(addr), Some(kind)) = (u64::from_str_radix(addr, 16), SymbolKind::of(kind)) else {
                continue;
            };
            // Hidden addresses (read without privilege) and per-CPU offsets.
            if addr < 1 << 47 {
                continue;
            }
            let id = *interned.entry(name).or_insert_with(|| {
                names.push(name.into());
                (names.len() - 1) as u32
            });
            symbols.push((addr, kind, id));
        }
        symbols.sort_by_key(|(addr, _, _)| *addr);
        let data = symbols
            .iter()
            .filter(|(_, kind, _)| *kind == SymbolKind::Data)
            .count();
        Self {
            symbols,
            names,
            has_data: data >= MIN_DATA_SYMBOLS,
        }
    }

    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The symbol of `kind` that `addr` falls in and the offset into it:
    /// the nearest one at or below, if the next symbol of any kind starts
    /// above `addr` (an address past a symbol's end belongs to the next).
    pub fn lookup(&self, addr: u64, kind: SymbolKind) -> Option<(&str, u64)> {
        if kind == SymbolKind::Data && !self.has_data {
            return None;
        }
        let at = self.symbols.partition_point(|(a, _, _)| *a <= addr);
        let (start, found, name) = *self.symbols.get(at.checked_sub(1)?)?;
        if found != kind {
            return None;
        }
        let end = self
            .symbols
            .get(at)
            .map_or(start.saturating_add(LAST_SYMBOL_SPAN), |(next, _, _)| *next);
        let offset = addr - start;
        let near = kind == SymbolKind::Code || offset < DATA_SPAN;
        (addr < end && near).then(|| (&*self.names[name as usize], offset))
    }

    /// `name+0xoff` (`name` alone at offset 0), or None outside any symbol of `kind`.
    pub fn name(&self, addr: u64, kind: SymbolKind) -> Option<String> {
        self.lookup(addr, kind).map(|(name, offset)| match offset {
            0 => name.to_owned(),
            _ => format!("{name}+{offset:#x}"),
        })
    }

    /// A call-stack frame: its function and offset, else the bare address.
    pub fn frame(&self, addr: u64) -> String {
        self.name(addr, SymbolKind::Code)
            .unwrap_or_else(|| format!("{addr:#x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "0000000000000000 A fixed_percpu_data\n\
        0000000000012340 D runqueues\n\
        ffffffff81000000 T _stext\n\
        ffffffff81234560 t anon_pipe_write\n\
        ffffffff81234900 T anon_pipe_read\n\
        ffffffff82000000 D jiffies_lock\n\
        ffffffff82000040 b tasklist_lock\n\
        ffffffffc0001000 t mod_fn\t[some_module]\n";

    /// KALLSYMS and, far above it, the many data symbols of a kernel with
    /// `CONFIG_KALLSYMS_ALL`.
    fn with_all_symbols() -> KernelSymbols {
        let mut text = KALLSYMS.to_owned();
        for i in 0..MIN_DATA_SYMBOLS as u64 {
            text.push_str(&format!("{:x} d filler_{i}\n", 0xffffffff90000000u64 + i * 64));
        }
        KernelSymbols::parse(&text)
    }

    #[test]
    fn code_and_data_addresses_name_their_symbol() {
        let syms = with_all_symbols();
        assert_eq!(
            syms.len(),
            6 + MIN_DATA_SYMBOLS,
            "per-CPU offsets and absolute symbols are left out"
        );
        assert_eq!(syms.frame(0xffffffff81234560), "anon_pipe_write");
        assert_eq!(syms.frame(0xffffffff812345b0), "anon_pipe_write+0x50");
        assert_eq!(syms.frame(0xffffffff81234901), "anon_pipe_read+0x1");
        assert_eq!(
            syms.name(0xffffffff82000008, SymbolKind::Data).as_deref(),
            Some("jiffies_lock+0x8")
        );
        assert_eq!(
            syms.name(0xffffffff82000040, SymbolKind::Data).as_deref(),
            Some("tasklist_lock")
        );
        assert_eq!(syms.frame(0xffffffffc0001010), "mod_fn+0x10");
    }

    #[test]
    fn addresses_outside_a_symbol_of_that_kind_are_not_named() {
        let syms = with_all_symbols();
        // A code address is not a data symbol, a data one not a frame.
        assert_eq!(syms.name(0xffffffff81234570, SymbolKind::Data), None);
        assert_eq!(syms.frame(0xffffffff82000010), "0xffffffff82000010");
        // Below the first symbol, and far past the last one (a heap address).
        assert_eq!(syms.frame(0xffffffff80000000), "0xffffffff80000000");
        assert_eq!(syms.name(0xffffffffc0100000, SymbolKind::Code), None);
        // Read without privilege, every address is 0.
        assert!(KernelSymbols::parse("0000000000000000 T _stext\n").is_empty());
        // Far into a data symbol: a gap kallsyms does not list.
        assert_eq!(syms.name(0xffffffff82000040 + DATA_SPAN, SymbolKind::Data), None);
    }

    /// Without `CONFIG_KALLSYMS_ALL` (this project's development host) the
    /// few data symbols are section markers: nothing is named after them.
    #[test]
    fn a_kernel_without_data_symbols_names_no_static_lock() {
        let syms = KernelSymbols::parse(KALLSYMS);
        assert_eq!(syms.name(0xffffffff82000008, SymbolKind::Data), None);
        assert_eq!(syms.frame(0xffffffff812345b0), "anon_pipe_write+0x50");
    }
}
