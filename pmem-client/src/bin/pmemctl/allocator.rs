//! The allocator commands: `format`, `alloc`, `free`, `open`, `rm`, `ls`,
//! `df` and `scrub`, and how they fail.

use pmem_client::alloc::{NamedObject, ScrubReport, Usage};
use pmem_client::{AllocError, Allocator, Placement};
use topology::{ByteSize, VirtAddr};

use crate::ctl::{CliError, Ctl};
use crate::show;

impl Ctl<'_> {
    /// A failed allocator operation, with advice where there is some.
    fn alloc_failed(&self, what: String, source: AllocError) -> CliError {
        let hint = match &source {
            AllocError::AlreadyFormatted { .. } => {
                Some("add --force to format it anyway".to_owned())
            }
            AllocError::NameNotFound(_) => Some("`pmemctl ls` lists the named objects".to_owned()),
            AllocError::NotOwner { owner, .. } => {
                let owner = self.client_name(*owner);
                Some(format!("run it as {owner} (`--client {owner}`)"))
            }
            AllocError::OutOfMemory { .. } | AllocError::PageTableFull { .. } => {
                Some("`pmemctl df` shows what is free".to_owned())
            }
            _ => None,
        };
        CliError::Alloc { what, source, hint }
    }

    /// Attaches to the pool's allocator and runs `op` with it; a failure
    /// of either is reported as `what`.
    fn with_allocator<T>(
        &self,
        what: impl FnOnce() -> String,
        op: impl AsyncFnOnce(&Allocator) -> Result<T, AllocError>,
    ) -> Result<T, CliError> {
        let handle = self.pool.handle().clone();
        self.pool
            .block_on(async {
                let allocator = Allocator::attach(handle).await?;
                op(&allocator).await
            })
            .map_err(|e| self.alloc_failed(what(), e))
    }

    /// `format [--force]`.
    pub fn format(&self, force: bool) -> Result<String, CliError> {
        let handle = self.pool.handle().clone();
        let pool = handle.pool_name().to_owned();
        let usage = self
            .pool
            .block_on(async {
                let allocator = Allocator::format(handle, force).await?;
                allocator.usage().await
            })
            .map_err(|e| self.alloc_failed("format".to_owned(), e))?;
        let regions = usage.regions.len();
        Ok(format!(
            "formatted pool {pool:?}: {} extents of {} free in {regions} region{} ({})\n",
            usage.total_extents(),
            ByteSize(usage.extent_size),
            if regions == 1 { "" } else { "s" },
            ByteSize(usage.total_extents() * usage.extent_size)
        ))
    }

    /// `alloc SIZE [--name NAME] [--server S [--socket K]]`: the size and
    /// the address, last on the line.
    pub fn alloc(
        &self,
        size: u64,
        name: Option<&str>,
        placement: &Placement,
    ) -> Result<String, CliError> {
        let what = || match name {
            Some(name) => format!("allocate {size} bytes as {name:?}"),
            None => format!("allocate {size} bytes"),
        };
        let attempt = self.with_allocator(what, async |a| {
            let result = match name {
                Some(name) => a.alloc_named_with(name, size, placement).await,
                None => a.alloc_with(size, placement).await,
            };
            match result {
                Ok(vaddr) => Ok(Ok(vaddr)),
                Err(e @ (AllocError::OutOfMemory { .. } | AllocError::PageTableFull { .. })) => {
                    Ok(Err((e, a.usage().await.ok())))
                }
                Err(e) => Err(e),
            }
        })?;
        let vaddr = attempt.map_err(|(source, usage)| no_room(size, placement, source, usage))?;
        let named = name.map(|n| format!(" as {n:?}")).unwrap_or_default();
        Ok(format!(
            "allocated {}{named} at {:#x}\n",
            show::size(size),
            vaddr.get()
        ))
    }

    /// `free ADDR`.
    pub fn free(&self, addr: u64) -> Result<String, CliError> {
        self.with_allocator(|| "free".to_owned(), async |a| a.free(VirtAddr(addr)).await)?;
        Ok(format!("freed {addr:#x}\n"))
    }

    /// `open NAME`: the size and the address, last on the line.
    pub fn open(&self, name: &str) -> Result<String, CliError> {
        let (vaddr, size) =
            self.with_allocator(|| format!("open {name:?}"), async |a| a.open(name).await)?;
        Ok(format!(
            "{name:?}: {} at {:#x}\n",
            show::size(size),
            vaddr.get()
        ))
    }

    /// `rm NAME`.
    pub fn remove(&self, name: &str) -> Result<String, CliError> {
        self.with_allocator(
            || format!("remove {name:?}"),
            async |a| a.remove(name).await,
        )?;
        Ok(format!("removed {name:?}\n"))
    }

    /// `ls`: one row per named object.
    pub fn list(&self) -> Result<String, CliError> {
        let objects = self.with_allocator(
            || "list the named objects".to_owned(),
            async |a| a.list().await,
        )?;
        if objects.is_empty() {
            return Ok("no named objects\n".to_owned());
        }
        let rows: Vec<Vec<String>> = objects
            .iter()
            .map(|o| {
                vec![
                    o.name.clone(),
                    format!("{:#x}", o.vaddr.get()),
                    ByteSize(o.size).to_string(),
                    self.client_name(o.owner),
                    extents(o),
                ]
            })
            .collect();
        Ok(show::table(
            &["NAME", "ADDRESS", "SIZE", "OWNER", "EXTENTS"],
            &rows,
        ))
    }

    /// The topology's id of client `index`, or `#index` if it has none.
    fn client_name(&self, index: u16) -> String {
        self.clients
            .get(usize::from(index))
            .cloned()
            .unwrap_or_else(|| format!("#{index}"))
    }

    /// `df`: extents and bytes per region, totals, slabs.
    pub fn df(&self) -> Result<String, CliError> {
        let usage = self.with_allocator(
            || "read the pool's usage".to_owned(),
            async |a| a.usage().await,
        )?;
        Ok(render_usage(self.pool.handle().pool_name(), &usage))
    }

    /// `scrub`: one line per kind of thing reclaimed.
    pub fn scrub(&self) -> Result<String, CliError> {
        let report = self.with_allocator(|| "scrub".to_owned(), async |a| a.scrub().await)?;
        Ok(render_scrub(&report))
    }
}

/// An allocation that found no room, told in the units it was asked in:
/// `out of memory, 1GiB requested, 242MiB free in the pool`.
fn no_room(size: u64, placement: &Placement, source: AllocError, usage: Option<Usage>) -> CliError {
    if usage.is_none() {
        return CliError::Alloc {
            what: format!("allocate {}", ByteSize(size)),
            source,
            hint: Some("`pmemctl df` shows what is free".to_owned()),
        };
    }
    let requested = ByteSize(size);
    let where_ = match placement {
        Placement::RoundRobin => "in the pool".to_owned(),
        Placement::Server(server) => format!("on server {server}"),
        Placement::Socket(server, _) => format!("on server {server}"),
    };
    let what = match &usage {
        Some(usage) => {
            let extent = usage.extent_size;
            let free = match placement {
                Placement::RoundRobin => usage.free_extents(),
                Placement::Server(server) | Placement::Socket(server, _) => usage
                    .regions
                    .iter()
                    .filter(|r| r.server == server.as_str())
                    .map(|r| r.free())
                    .sum(),
            };
            let free_bytes = free.saturating_mul(extent);
            if free_bytes >= size {
                format!(
                    "cannot allocate {requested}: {requested} requested and {} free {where_}, \
                     but not where one allocation can take it",
                    ByteSize(free_bytes)
                )
            } else {
                format!(
                    "cannot allocate {requested}: out of memory, {requested} requested, {} \
                     free {where_} ({free} extents of {})",
                    ByteSize(free_bytes),
                    ByteSize(extent)
                )
            }
        }
        None => String::new(),
    };
    CliError::NoRoom(what)
}

/// A named object's extents as `SERVER/REGION`, in order, with `*N` when
/// `N` of them in a row are in one region: `A/A1,B/B1*2`.
fn extents(object: &NamedObject) -> String {
    let mut runs: Vec<(String, usize)> = Vec::new();
    for (server, region, _) in &object.extents {
        let place = format!("{server}/{region}");
        match runs.last_mut() {
            Some((last, n)) if *last == place => *n += 1,
            _ => runs.push((place, 1)),
        }
    }
    if runs.is_empty() {
        return "-".to_owned();
    }
    runs.into_iter()
        .map(|(place, n)| {
            if n == 1 {
                place
            } else {
                format!("{place}*{n}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The `df` text: a heading, a table per region with a total row, and a
/// line on slabs.
fn render_usage(pool: &str, usage: &Usage) -> String {
    let extent = usage.extent_size;
    let row = |server: &str, region: &str, total: u64, used: u64| {
        let free = total.saturating_sub(used);
        vec![
            server.to_owned(),
            region.to_owned(),
            total.to_string(),
            used.to_string(),
            free.to_string(),
            ByteSize(total * extent).to_string(),
            ByteSize(used * extent).to_string(),
            ByteSize(free * extent).to_string(),
        ]
    };
    let mut rows: Vec<Vec<String>> = usage
        .regions
        .iter()
        .map(|r| row(&r.server, &r.region, r.extents, r.used.min(r.extents)))
        .collect();
    let total = usage.total_extents();
    let free = usage.free_extents();
    rows.push(row("total", "-", total, total.saturating_sub(free)));
    let mut text = format!(
        "pool {pool:?}: {free} of {total} extents free ({} of {}), extent size {}\n\n",
        ByteSize(free * extent),
        ByteSize(total * extent),
        ByteSize(extent)
    );
    text.push_str(&show::table(
        &[
            "SERVER",
            "REGION",
            "EXTENTS",
            "USED",
            "FREE",
            "CAPACITY",
            "ALLOCATED",
            "AVAILABLE",
        ],
        &rows,
    ));
    if usage.slabs == 0 {
        text.push_str("\nslabs: none\n");
        return text;
    }
    text.push_str(&format!(
        "\nslabs: {} ({} in extents), {} object{} in use ({})\n",
        usage.slabs,
        ByteSize(usage.slabs * extent),
        usage.slab_objects,
        if usage.slab_objects == 1 { "" } else { "s" },
        show::size(usage.slab_bytes)
    ));
    text
}

/// The `scrub` text: `pool is consistent`, or one line per non-zero count.
fn render_scrub(report: &ScrubReport) -> String {
    if report.is_clean() {
        return "pool is consistent\n".to_owned();
    }
    let counts = [
        (
            report.entries_reclaimed,
            "page-table entries of allocations cut short, freed",
        ),
        (
            report.extents_reclaimed,
            "extents no live allocation holds, freed",
        ),
        (
            report.keys_cleared,
            "extent keys left on free extents, cleared",
        ),
        (
            report.repaired,
            "bits or keys missing from live allocations, restored",
        ),
        (
            report.slab_objects_reclaimed,
            "slab objects claimed but never completed, freed",
        ),
        (
            report.slab_counts_fixed,
            "slab headers with a wrong count, corrected",
        ),
        (
            report.slabs_retired,
            "empty or half-retired slabs, extent freed",
        ),
        (
            report.names_reclaimed,
            "name entries of objects never completed or gone, cleared",
        ),
        (
            report.hints_cleared,
            "slab hints naming no live slab, cleared",
        ),
        (
            report.left_to_owners,
            "records of other clients, left for their owners to scrub",
        ),
    ];
    let mut text = "scrub repaired the pool:\n".to_owned();
    for (count, what) in counts {
        if count > 0 {
            text.push_str(&format!("  {what}: {count}\n"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmem_client::alloc::RegionUsage;
    use topology::PmemAddr;

    #[test]
    fn extents_group_runs_of_one_region() {
        let object = |places: &[(&str, &str)]| NamedObject {
            name: "x".into(),
            vaddr: VirtAddr(1 << 40),
            size: 1,
            owner: 0,
            extents: places
                .iter()
                .map(|(s, r)| ((*s).to_owned(), (*r).to_owned(), PmemAddr(0)))
                .collect(),
        };
        assert_eq!(extents(&object(&[])), "-");
        assert_eq!(
            extents(&object(&[("A", "A1"), ("B", "B1"), ("A", "A2")])),
            "A/A1,B/B1,A/A2"
        );
        assert_eq!(
            extents(&object(&[("A", "A1"), ("A", "A1"), ("B", "B1")])),
            "A/A1*2,B/B1"
        );
    }

    #[test]
    fn usage_has_a_row_per_region_and_a_total() {
        let usage = Usage {
            extent_size: 1 << 20,
            regions: vec![
                RegionUsage {
                    server: "A".into(),
                    region: "A1".into(),
                    extents: 3,
                    used: 1,
                },
                RegionUsage {
                    server: "B".into(),
                    region: "B1".into(),
                    extents: 3,
                    used: 0,
                },
            ],
            slabs: 1,
            slab_objects: 2,
            slab_bytes: 128,
        };
        let text = render_usage("test", &usage);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert!(
            text.starts_with("pool \"test\": 5 of 6 extents free (5MiB of 6MiB)"),
            "{text}"
        );
        assert!(
            rows.contains(&vec!["A", "A1", "3", "1", "2", "3MiB", "1MiB", "2MiB"]),
            "{text}"
        );
        assert!(
            rows.contains(&vec!["total", "-", "6", "1", "5", "6MiB", "1MiB", "5MiB"]),
            "{text}"
        );
        assert!(
            text.contains("slabs: 1 (1MiB in extents), 2 objects in use (128 bytes)"),
            "{text}"
        );
    }

    #[test]
    fn scrub_lists_only_what_it_did() {
        assert_eq!(
            render_scrub(&ScrubReport::default()),
            "pool is consistent\n"
        );
        let report = ScrubReport {
            entries_reclaimed: 3,
            extents_reclaimed: 2,
            ..ScrubReport::default()
        };
        let text = render_scrub(&report);
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.contains("allocations cut short, freed: 3"), "{text}");
        assert!(
            text.contains("no live allocation holds, freed: 2"),
            "{text}"
        );
    }
}
