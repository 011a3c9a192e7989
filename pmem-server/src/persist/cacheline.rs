//! CPU cache-line write-back (CLWB / CLFLUSHOPT / CLFLUSH) and the store fence
//! that orders it, for DAX mappings where persistence is a CPU matter.
//!
//! The instructions are legal on any mapped memory; on persistent memory in
//! an ADR platform, a written-back line followed by SFENCE is durable.
//!
//! Detection uses CPUID directly: `is_x86_feature_detected!` knows neither
//! `clwb` nor `clflushopt`. CLWB (CPUID.(EAX=7,ECX=0):EBX bit 24) keeps the
//! line cached; CLFLUSHOPT (bit 23) evicts it but is weakly ordered; CLFLUSH
//! (CPUID.01H:EDX bit 19, present on every x86_64 CPU) evicts it and is
//! serialising. The line size is CPUID.01H:EBX bits 15..8 times 8.

use std::sync::OnceLock;

/// One cache-line write-back instruction.
///
/// Has no variants on targets other than x86_64: no value can be made there,
/// so nothing can ask for a flush that does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlushInstruction {
    /// Write back, keep the line cached.
    #[cfg(target_arch = "x86_64")]
    Clwb,
    /// Write back and invalidate, weakly ordered.
    #[cfg(target_arch = "x86_64")]
    Clflushopt,
    /// Write back and invalidate, ordered with other CLFLUSHes and stores.
    #[cfg(target_arch = "x86_64")]
    Clflush,
}

impl FlushInstruction {
    /// The assembler name, for messages and test output.
    #[cfg_attr(not(all(test, target_arch = "x86_64")), allow(dead_code))]
    pub(crate) fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            FlushInstruction::Clwb => "clwb",
            #[cfg(target_arch = "x86_64")]
            FlushInstruction::Clflushopt => "clflushopt",
            #[cfg(target_arch = "x86_64")]
            FlushInstruction::Clflush => "clflush",
        }
    }
}

/// What this CPU offers for writing cache lines back, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuFlushSupport {
    clwb: bool,
    clflushopt: bool,
    clflush: bool,
    /// Cache-line size in bytes; a power of two.
    line: usize,
}

impl CpuFlushSupport {
    /// The CPU's support, read with CPUID on first use.
    pub(crate) fn get() -> CpuFlushSupport {
        static SUPPORT: OnceLock<CpuFlushSupport> = OnceLock::new();
        *SUPPORT.get_or_init(CpuFlushSupport::detect)
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> CpuFlushSupport {
        use core::arch::x86_64::__cpuid_count;

        /// Used when CPUID reports no usable size; every x86_64 CPU to date
        /// has 64-byte lines.
        const DEFAULT_LINE: usize = 64;

        // The CPUID intrinsics are safe functions in newer Rust releases and
        // unsafe ones in the workspace's minimum version; accept both.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID exists on every x86_64 CPU and has no side effects.
        let max_leaf = unsafe { __cpuid_count(0, 0) }.eax;
        #[allow(unused_unsafe)]
        // SAFETY: leaf 1 is below the maximum leaf on every x86_64 CPU.
        let leaf1 = unsafe { __cpuid_count(1, 0) };
        let (clwb, clflushopt) = if max_leaf >= 7 {
            #[allow(unused_unsafe)]
            // SAFETY: leaf 7 is supported, as checked against the maximum leaf.
            let leaf7 = unsafe { __cpuid_count(7, 0) };
            (leaf7.ebx & (1 << 24) != 0, leaf7.ebx & (1 << 23) != 0)
        } else {
            (false, false)
        };
        let clflush = leaf1.edx & (1 << 19) != 0;
        let reported = ((leaf1.ebx >> 8) & 0xff) as usize * 8;
        let line = if reported >= 16 && reported.is_power_of_two() {
            reported
        } else {
            DEFAULT_LINE
        };
        CpuFlushSupport {
            clwb,
            clflushopt,
            clflush,
            line,
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> CpuFlushSupport {
        CpuFlushSupport {
            clwb: false,
            clflushopt: false,
            clflush: false,
            line: 64,
        }
    }

    /// Whether the CPU executes `instruction`.
    pub(crate) fn supports(self, instruction: FlushInstruction) -> bool {
        match instruction {
            #[cfg(target_arch = "x86_64")]
            FlushInstruction::Clwb => self.clwb,
            #[cfg(target_arch = "x86_64")]
            FlushInstruction::Clflushopt => self.clflushopt,
            #[cfg(target_arch = "x86_64")]
            FlushInstruction::Clflush => self.clflush,
        }
    }

    /// Every supported instruction, best first.
    pub(crate) fn supported(self) -> impl Iterator<Item = FlushInstruction> {
        #[cfg(target_arch = "x86_64")]
        let all = [
            FlushInstruction::Clwb,
            FlushInstruction::Clflushopt,
            FlushInstruction::Clflush,
        ];
        #[cfg(not(target_arch = "x86_64"))]
        let all: [FlushInstruction; 0] = [];
        all.into_iter().filter(move |&i| self.supports(i))
    }

    /// The flusher a DAX mapping should use: the best supported instruction,
    /// or `None` when the CPU has no way to write a line back.
    pub(crate) fn best(self) -> Option<CacheLineFlusher> {
        let instruction = self.supported().next()?;
        Some(CacheLineFlusher {
            instruction,
            line: self.line,
        })
    }

    /// A flusher for a specific supported instruction (tests and
    /// measurements compare them).
    #[cfg_attr(not(all(test, target_arch = "x86_64")), allow(dead_code))]
    pub(crate) fn flusher(self, instruction: FlushInstruction) -> Option<CacheLineFlusher> {
        self.supports(instruction).then_some(CacheLineFlusher {
            instruction,
            line: self.line,
        })
    }
}

/// Writes cache lines back with one instruction the CPU is known to support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheLineFlusher {
    instruction: FlushInstruction,
    line: usize,
}

impl CacheLineFlusher {
    /// The instruction this flusher issues.
    #[cfg_attr(not(all(test, target_arch = "x86_64")), allow(dead_code))]
    pub(crate) fn instruction(self) -> FlushInstruction {
        self.instruction
    }

    /// Issues a write-back for every cache line that overlaps
    /// `[addr, addr + len)`. Does not wait for completion: follow with
    /// [`store_fence`] before relying on durability.
    ///
    /// # Safety
    ///
    /// Every byte of `[addr, addr + len)` must be mapped in this process for
    /// the duration of the call. (Lines are widened to cache-line boundaries;
    /// a cache line never crosses a page, so the widened range stays mapped.
    /// Write-back never changes memory contents, so concurrent stores by
    /// other threads are unaffected.)
    pub(crate) unsafe fn write_back(self, addr: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        let first = addr.addr() & !(self.line - 1);
        // Cannot overflow: the range is mapped, so it ends inside the
        // address space.
        let end = addr.addr() + len;
        #[cfg(target_arch = "x86_64")]
        {
            let lines = (first..end).step_by(self.line).map(|a| addr.with_addr(a));
            match self.instruction {
                FlushInstruction::Clwb => {
                    for line in lines {
                        // SAFETY: `line` is the start of a cache line that
                        // overlaps the caller's mapped range, hence mapped
                        // (same page). CLWB only writes the line back; no
                        // stack use, flags untouched. The asm is not marked
                        // `nomem`, so earlier stores are not moved past it.
                        unsafe {
                            core::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags));
                        }
                    }
                }
                FlushInstruction::Clflushopt => {
                    for line in lines {
                        // SAFETY: as for CLWB above; CLFLUSHOPT also
                        // invalidates the line, which never changes what
                        // memory holds.
                        unsafe {
                            core::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags));
                        }
                    }
                }
                FlushInstruction::Clflush => {
                    for line in lines {
                        // SAFETY: as for CLWB above; CLFLUSH writes back and
                        // invalidates the mapped line.
                        unsafe {
                            core::arch::asm!("clflush [{0}]", in(reg) line, options(nostack, preserves_flags));
                        }
                    }
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (first, end);
            match self.instruction {}
        }
    }
}

/// Waits until earlier stores, non-temporal stores and CLWB/CLFLUSHOPT
/// write-backs of this thread are globally visible (SFENCE on x86_64). Also a
/// compiler barrier.
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SFENCE has no operands and only orders memory operations; no
    // stack use, flags untouched. Not `nomem`, so it is a compiler barrier.
    unsafe {
        core::arch::asm!("sfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn detects_a_flush_instruction_on_x86_64() {
        let support = CpuFlushSupport::get();
        assert!(support.line.is_power_of_two());
        let best = support.best().expect("every x86_64 CPU has CLFLUSH");
        assert_eq!(Some(best.instruction()), support.supported().next());
        assert!(support.supports(FlushInstruction::Clflush));
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[test]
    fn no_flush_instruction_elsewhere() {
        assert!(CpuFlushSupport::get().best().is_none());
    }

    /// Runs every instruction this CPU supports over ordinary heap memory:
    /// the DAX flush path is exercised even on machines without DAX.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_supported_instruction_flushes_ordinary_memory() {
        let support = CpuFlushSupport::get();
        let mut buffer: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
        let expected = buffer.clone();
        let mut exercised = Vec::new();
        for instruction in support.supported() {
            let flusher = support.flusher(instruction).expect("supported");
            for (offset, len) in [
                (4096, 0),
                (4096, 1),
                (4097, 63),
                (4095, 2),
                (4000, 200),
                (4096 + 60, 8),
                (1, 2 * 4096),
                (4096, 4096),
            ] {
                // Dirty the lines first so the write-back has work to do.
                for b in &mut buffer[offset..offset + len] {
                    *b = b.wrapping_add(1);
                }
                for b in &mut buffer[offset..offset + len] {
                    *b = b.wrapping_sub(1);
                }
                // SAFETY: [offset, offset + len) lies inside `buffer`; the
                // widened lines lie in the same, mapped, heap pages.
                unsafe { flusher.write_back(buffer.as_ptr().add(offset), len) };
                store_fence();
            }
            exercised.push(instruction.name());
        }
        assert_eq!(buffer, expected);
        assert!(exercised.contains(&"clflush"), "exercised {exercised:?}");
    }
}
