//! An emulated persistence domain, for power-loss tests.
//!
//! A region file mapped in this mode is the *durable image* of the region.
//! The mapping itself is private (copy-on-write): stores land in the
//! process's own memory, which stands for the CPU caches, and never reach
//! the file by themselves. [`PmemMap::persist`](super::PmemMap::persist)
//! writes the cache lines covering its range from that memory into the file,
//! as CLWB and SFENCE do on a DAX mapping. Killing the process therefore
//! loses exactly what a power cut would lose: every store that was not
//! persisted. (The page cache keeps the file across the kill; it plays the
//! part of the persistent media.)
//!
//! A [`PowerDomain`] is the set of mappings that lose power together: a
//! server's region files and its exactly-once file. A test can cut its power
//! after a given number of persist steps. From then on persists do nothing,
//! as after a real power failure, and the process runs on without knowing,
//! so the test decides what counts as acknowledged by asking
//! [`PowerDomain::is_on`] after each response. At the cut, a random subset
//! of the 8-byte words that were written but not persisted may be written to
//! the files too, as caches evicting lines in any order would do; a word is
//! never torn.
//!
//! This is a model for finding missing or misordered flushes. It is not a
//! way to keep data: nothing is durable across a crash of the machine.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use memmap2::{MmapMut, MmapOptions};

use super::PersistError;

/// Bytes the domain persists at a time, like a cache line.
pub const LINE: usize = 64;
/// Bytes that reach the durable image whole, even at a power cut.
pub const WORD: usize = 8;

/// Mappings that lose power together, and the switch that cuts it.
///
/// `PowerDomain::process()` is the one a server uses for the `emulated`
/// policy; tests make their own with [`PowerDomain::new`].
#[derive(Debug)]
pub struct PowerDomain {
    state: Mutex<DomainState>,
}

#[derive(Debug)]
struct DomainState {
    /// Persist steps taken while the power was on.
    steps: u64,
    /// Cut the power when this many steps have been taken.
    cut_after: Option<u64>,
    /// At the cut, persist a random subset of the unpersisted words, drawn
    /// from this generator.
    eviction: Option<fastrand::Rng>,
    on: bool,
    /// End the process at the cut, as a machine losing power stops.
    exit_at_cut: bool,
    images: Vec<Weak<Image>>,
}

/// The exit status of a process whose emulated power was cut.
pub const POWER_CUT_EXIT: i32 = 86;

impl PowerDomain {
    /// A domain with the power on and no cut planned.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(DomainState {
                steps: 0,
                cut_after: None,
                eviction: None,
                on: true,
                exit_at_cut: false,
                images: Vec::new(),
            }),
        })
    }

    /// The domain of this process, used by the `emulated` policy of a
    /// server's configuration. Its power is never cut from inside: killing
    /// the process is the cut.
    pub fn process() -> Arc<Self> {
        static PROCESS: OnceLock<Arc<PowerDomain>> = OnceLock::new();
        Arc::clone(PROCESS.get_or_init(PowerDomain::new))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DomainState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cuts the power once `steps` persist steps have been taken in all (so
    /// `0` cuts before the first). With `eviction`, a random subset of the
    /// words written but not persisted at that moment reaches the files,
    /// drawn from that seed.
    pub fn cut_after(&self, steps: u64, eviction: Option<u64>) {
        let mut state = self.lock();
        state.cut_after = Some(steps);
        state.eviction = eviction.map(fastrand::Rng::with_seed);
        if state.on && state.steps >= steps {
            state.cut();
        }
    }

    /// Like [`cut_after`](Self::cut_after), and the process ends at the cut
    /// (status [`POWER_CUT_EXIT`], nothing written back, no destructor
    /// run), so no request is answered after it: what a test of the whole
    /// daemon needs, where every answer a client got counts.
    /// The cut comes when step `steps + 1` is attempted (never before the
    /// process persists anything).
    pub fn exit_after(&self, steps: u64, eviction: Option<u64>) {
        let mut state = self.lock();
        state.exit_at_cut = true;
        state.cut_after = Some(steps);
        state.eviction = eviction.map(fastrand::Rng::with_seed);
    }

    /// Cuts the power now; see [`cut_after`](Self::cut_after).
    pub fn cut_now(&self, eviction: Option<u64>) {
        let steps = self.steps();
        self.cut_after(steps, eviction);
    }

    /// Whether the power is still on: what the server did so far counts.
    pub fn is_on(&self) -> bool {
        self.lock().on
    }

    /// Persist steps taken while the power was on.
    pub fn steps(&self) -> u64 {
        self.lock().steps
    }

    fn register(&self, image: &Arc<Image>) {
        let mut state = self.lock();
        state.images.retain(|i| i.strong_count() > 0);
        state.images.push(Arc::downgrade(image));
    }

    /// Runs one persist step, `write`, unless the power is off or this is
    /// the step the cut comes before. Steps are serialised, so a cut falls
    /// between two of them.
    fn step(&self, write: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let mut state = self.lock();
        if !state.on {
            return Ok(());
        }
        if state.cut_after.is_some_and(|at| state.steps >= at) {
            state.cut();
            return Ok(());
        }
        state.steps += 1;
        write()
    }
}

impl DomainState {
    /// Turns the power off, first letting the caches evict what the
    /// eviction generator picks. Failures to write an evicted word are
    /// ignored: a word that does not reach the media is one that was not
    /// evicted.
    fn cut(&mut self) {
        self.on = false;
        if let Some(rng) = self.eviction.as_mut() {
            for image in self.images.iter().filter_map(Weak::upgrade) {
                image.evict_some(rng);
            }
        }
        if self.exit_at_cut {
            tracing::warn!("emulated power cut after {} persist steps", self.steps);
            // SAFETY: _exit(2) ends the process at once; nothing after it
            // runs, which is the point (a power cut runs no clean-up).
            unsafe { libc::_exit(POWER_CUT_EXIT) };
        }
    }
}

/// The part of an emulated mapping the domain reaches at a cut: the file,
/// the private memory and which lines of it were written.
#[derive(Debug)]
struct Image {
    file: File,
    base: NonNull<u8>,
    len: usize,
    /// Lines written since they were last persisted (a superset: an atomic
    /// marks its line when it is handed out).
    dirty: Mutex<BTreeSet<usize>>,
}

// SAFETY: `base` is the address of a private mapping owned by the
// `EmulatedMapping` holding this image. The domain reaches the image only
// under its lock, and a mapping leaves the domain under that lock before it
// is unmapped (`EmulatedMapping`'s Drop), so the memory is mapped whenever
// it is read. The file and the dirty set are Send + Sync themselves.
unsafe impl Send for Image {}
// SAFETY: as above; every access to the memory is a raw-pointer read handed
// to pwrite(2), which races with stores only in the way the persistence
// module's concurrency contract allows.
unsafe impl Sync for Image {}

impl Image {
    /// Writes `len` bytes at `offset` of the private memory to the same
    /// place in the file.
    fn write_through(&self, offset: usize, len: usize) -> io::Result<()> {
        let mut done = 0;
        while done < len {
            let at = offset + done;
            // SAFETY: callers keep `[offset, offset + len)` inside the
            // mapping; pwrite reads the bytes through the raw pointer without
            // a Rust reference to them being formed.
            let wrote = unsafe {
                libc::pwrite(
                    self.file.as_raw_fd(),
                    self.base.as_ptr().add(at).cast(),
                    len - done,
                    at as libc::off_t,
                )
            };
            match wrote {
                n if n > 0 => done += n as usize,
                0 => return Err(io::ErrorKind::WriteZero.into()),
                _ => {
                    let err = io::Error::last_os_error();
                    if err.kind() != io::ErrorKind::Interrupted {
                        return Err(err);
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes back every line that `[offset, offset + len)` touches.
    fn write_back(&self, offset: usize, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let first = offset / LINE;
        let last = (offset + len - 1) / LINE;
        let start = first * LINE;
        let end = ((last + 1) * LINE).min(self.len);
        self.write_through(start, end - start)?;
        let mut dirty = self.dirty.lock().unwrap_or_else(PoisonError::into_inner);
        let clean: Vec<usize> = dirty.range(first..=last).copied().collect();
        for line in clean {
            dirty.remove(&line);
        }
        Ok(())
    }

    fn mark(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        let mut dirty = self.dirty.lock().unwrap_or_else(PoisonError::into_inner);
        dirty.extend(offset / LINE..=(offset + len - 1) / LINE);
    }

    /// Writes each word of each dirty line to the file with probability ½.
    fn evict_some(&self, rng: &mut fastrand::Rng) {
        let dirty = self.dirty.lock().unwrap_or_else(PoisonError::into_inner);
        for &line in dirty.iter() {
            let start = line * LINE;
            for word in (start..(start + LINE).min(self.len)).step_by(WORD) {
                if rng.bool() {
                    let _ = self.write_through(word, WORD.min(self.len - word));
                }
            }
        }
    }
}

/// A region file mapped privately, persisted by writing lines to the file.
#[derive(Debug)]
pub(crate) struct EmulatedMapping {
    image: Arc<Image>,
    domain: Arc<PowerDomain>,
    _mmap: MmapMut,
}

impl Drop for EmulatedMapping {
    fn drop(&mut self) {
        // Leave the domain before the memory is unmapped, so a cut running
        // on another thread never reads it afterwards.
        let mut state = self.domain.lock();
        let image = Arc::downgrade(&self.image);
        state
            .images
            .retain(|i| !i.ptr_eq(&image) && i.strong_count() > 0);
    }
}

impl EmulatedMapping {
    /// Maps `len` bytes of `file` privately and joins `domain`.
    pub(crate) fn map(
        path: &Path,
        file: File,
        len: usize,
        domain: &Arc<PowerDomain>,
    ) -> Result<Self, PersistError> {
        let map_err = |source| PersistError::Map {
            path: path.to_owned(),
            source,
        };
        // SAFETY: the mapping is private, so nothing another process does
        // to the file changes bytes this process wrote; unwritten pages may
        // show later writes to the file, which only this mapping's own
        // write-backs make (or the media would, for a real DAX mapping).
        // No Rust references into it are formed (module contract).
        let mut mmap = unsafe { MmapOptions::new().len(len).map_copy(&file) }.map_err(map_err)?;
        let base = NonNull::new(mmap.as_mut_ptr()).ok_or_else(|| {
            map_err(io::Error::new(
                io::ErrorKind::InvalidData,
                "mapping at address 0",
            ))
        })?;
        let image = Arc::new(Image {
            file,
            base,
            len: mmap.len(),
            dirty: Mutex::new(BTreeSet::new()),
        });
        domain.register(&image);
        Ok(Self {
            image,
            domain: Arc::clone(domain),
            _mmap: mmap,
        })
    }

    pub(crate) fn base(&self) -> NonNull<u8> {
        self.image.base
    }

    pub(crate) fn len(&self) -> usize {
        self.image.len
    }

    /// Notes that `[offset, offset + len)` may have been written.
    pub(crate) fn mark_written(&self, offset: usize, len: usize) {
        self.image.mark(offset, len);
    }

    /// One persist step: the lines of `[offset, offset + len)` reach the
    /// file, unless the power is off. The range must be inside the mapping.
    pub(crate) fn persist(&self, offset: usize, len: usize) -> io::Result<()> {
        self.domain.step(|| self.image.write_back(offset, len))
    }
}
