//! Named objects: a directory of (name → allocation) in the pool metadata,
//! shared by every client.
//!
//! Creating `name`: read the directory, COMPARE_SWAP a FREE entry to
//! CLAIMING (the control word carries the name's hash), read the directory
//! again and back off if another entry of the same name is CLAIMING or LIVE
//! at a lower index (of two racing creators exactly one proceeds, and nobody
//! waits), allocate with the page-table head naming the entry, write the
//! entry, COMPARE_SWAP it CLAIMING → LIVE. Scrub reclaims entries and
//! allocations of creators that died before that last step. The control
//! word names the creator: only it may remove or change the entry.

use topology::{PmemAddr, VirtAddr};

use super::records::{self, EntryKind, NameEntry, NameState};
use super::{AllocError, Allocator, Placement};

/// A named object, as `list` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedObject {
    /// Its name.
    pub name: String,
    /// Where it starts.
    pub vaddr: VirtAddr,
    /// Its size in bytes.
    pub size: u64,
    /// The topology index of the client that created it.
    pub owner: u16,
    /// Its extents: (server, region, PMEM address).
    pub extents: Vec<(String, String, PmemAddr)>,
}

impl Allocator {
    /// Allocates `size` bytes under `name`, visible to every client, anywhere
    /// (round-robin across servers, as [`alloc`](Self::alloc)). Durable when
    /// it returns; the memory reads as zeroes.
    pub async fn alloc_named(&self, name: &str, size: u64) -> Result<VirtAddr, AllocError> {
        self.alloc_named_with(name, size, &Placement::RoundRobin)
            .await
    }

    /// Allocates `size` bytes under `name`, placed as `placement` asks.
    pub async fn alloc_named_with(
        &self,
        name: &str,
        size: u64,
        placement: &Placement,
    ) -> Result<VirtAddr, AllocError> {
        check_name(name)?;
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        let hash = records::name_hash(name);
        let dir = self.read_directory().await?;
        if find(&dir, name).is_some() {
            return Err(AllocError::NameExists(name.to_owned()));
        }
        let Some((slot, free)) = dir
            .iter()
            .enumerate()
            .find(|(_, e)| e.state == NameState::Free)
        else {
            return Err(AllocError::NamesFull(self.meta.names()));
        };
        let slot = slot as u64;
        let mut mine = NameEntry {
            state: NameState::Claiming,
            generation: free.generation.wrapping_add(1),
            owner: self.owner,
            hash,
            vaddr: 0,
            size,
            name: String::new(),
        };
        let at = self.meta.name_entry(slot);
        if self
            .cas(at, self.meta_key(), free.control(), mine.control())
            .await?
            != free.control()
        {
            return Err(AllocError::NameExists(name.to_owned()));
        }
        let again = self.read_directory().await?;
        let rival = again.iter().enumerate().any(|(i, e)| {
            (i as u64) < slot
                && e.hash == hash
                && matches!(e.state, NameState::Claiming | NameState::Live)
                && (e.name == name || e.state == NameState::Claiming)
        });
        if rival {
            let released = NameEntry {
                state: NameState::Free,
                ..mine.clone()
            };
            self.cas(at, self.meta_key(), mine.control(), released.control())
                .await?;
            return Err(AllocError::NameExists(name.to_owned()));
        }
        let vaddr = match self.alloc_inner(size, placement, Some(slot)).await {
            Ok(vaddr) => vaddr,
            Err(e) => {
                let released = NameEntry {
                    state: NameState::Free,
                    ..mine.clone()
                };
                let _ = self
                    .cas(at, self.meta_key(), mine.control(), released.control())
                    .await;
                return Err(e);
            }
        };
        mine.vaddr = vaddr.get();
        mine.name = name.to_owned();
        self.write(at, self.meta_key(), &mine.encode()).await?;
        let live = NameEntry {
            state: NameState::Live,
            ..mine.clone()
        };
        self.cas(at, self.meta_key(), mine.control(), live.control())
            .await?;
        Ok(vaddr)
    }

    /// The named object `name`: where it starts and its size (any client's,
    /// as `pmemobj_root` finds a pool's entry point).
    pub async fn open(&self, name: &str) -> Result<(VirtAddr, u64), AllocError> {
        let dir = self.read_directory().await?;
        let (_, e) = find(&dir, name).ok_or_else(|| AllocError::NameNotFound(name.to_owned()))?;
        if e.state != NameState::Live {
            return Err(AllocError::NameNotFound(name.to_owned()));
        }
        let vaddr = VirtAddr(e.vaddr);
        // Whatever this client cached for these extents may be stale.
        let extent = self.meta.extent_size();
        for i in 0..e.size.div_ceil(extent) {
            self.pool
                .invalidate_translation(VirtAddr(e.vaddr + i * extent));
        }
        Ok((vaddr, e.size))
    }

    /// Every named object, in directory order.
    pub async fn list(&self) -> Result<Vec<NamedObject>, AllocError> {
        let dir = self.read_directory().await?;
        let mut out = Vec::new();
        for e in dir.iter().filter(|e| e.state == NameState::Live) {
            let vaddr = VirtAddr(e.vaddr);
            let Some(index) = records::vextent_of(&self.meta, vaddr) else {
                continue;
            };
            let n = e.size.div_ceil(self.meta.extent_size()).max(1);
            let at = self.meta.page_table_entry(index);
            let bytes = self
                .read(at, self.meta_key(), (n * records::PT_ENTRY_LEN) as u32)
                .await?;
            let entries: Vec<_> = bytes
                .chunks(32)
                .filter_map(records::PtEntry::decode)
                .collect();
            let layout = self.pool.layout();
            let extents = entries
                .iter()
                .filter_map(|p| {
                    let at = layout.lookup(PmemAddr(p.pmem))?;
                    Some((
                        at.entry.server.to_string(),
                        at.entry.region_id.to_string(),
                        PmemAddr(p.pmem),
                    ))
                })
                .collect();
            out.push(NamedObject {
                name: e.name.clone(),
                vaddr,
                size: e.size,
                owner: entries.first().map_or(0, |p| p.control.owner),
                extents,
            });
        }
        Ok(out)
    }

    /// Removes the named object `name` and frees its memory; only the
    /// client that created it may (the servers check it too, with
    /// authentication).
    pub async fn remove(&self, name: &str) -> Result<(), AllocError> {
        let dir = self.read_directory().await?;
        let (slot, e) =
            find(&dir, name).ok_or_else(|| AllocError::NameNotFound(name.to_owned()))?;
        if e.state != NameState::Live {
            return Err(AllocError::NameNotFound(name.to_owned()));
        }
        if e.owner != self.owner {
            return Err(AllocError::NotOwner {
                what: format!("named object {name:?}"),
                owner: e.owner,
            });
        }
        let at = self.meta.name_entry(slot as u64);
        let removing = NameEntry {
            state: NameState::Removing,
            ..e.clone()
        };
        if self
            .cas(at, self.meta_key(), e.control(), removing.control())
            .await?
            != e.control()
        {
            return Err(AllocError::NameNotFound(name.to_owned()));
        }
        let vaddr = VirtAddr(e.vaddr);
        if let Some(index) = records::vextent_of(&self.meta, vaddr) {
            let entry = self.read_entry(index).await?;
            if entry.control.state == records::EntryState::Live
                && entry.control.kind == EntryKind::Head
            {
                self.free_extents(index, entry).await?;
            }
        }
        let free = NameEntry {
            state: NameState::Free,
            ..removing.clone()
        };
        self.cas(at, self.meta_key(), removing.control(), free.control())
            .await?;
        Ok(())
    }

    /// The whole name directory, read now.
    pub(super) async fn read_directory(&self) -> Result<Vec<NameEntry>, AllocError> {
        let len = (self.meta.names() * topology::meta::NAME_ENTRY_LEN) as u32;
        let bytes = self
            .read(self.meta.name_entry(0), self.meta_key(), len)
            .await?;
        bytes
            .chunks(topology::meta::NAME_ENTRY_LEN as usize)
            .enumerate()
            .map(|(i, chunk)| {
                NameEntry::decode(chunk).ok_or_else(|| AllocError::Corrupt {
                    what: format!("name-directory entry {i}"),
                })
            })
            .collect()
    }
}

/// The entry holding `name` (LIVE, or being created or removed).
fn find<'a>(dir: &'a [NameEntry], name: &str) -> Option<(usize, &'a NameEntry)> {
    dir.iter()
        .enumerate()
        .find(|(_, e)| e.state != NameState::Free && e.name == name)
}

fn check_name(name: &str) -> Result<(), AllocError> {
    if name.is_empty() || name.len() > records::MAX_NAME_LEN {
        return Err(AllocError::BadName {
            name: name.to_owned(),
            max: records::MAX_NAME_LEN,
        });
    }
    Ok(())
}
