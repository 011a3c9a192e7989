//! Layout math, sysfs and mountinfo parsing on fake trees, and regions on a
//! stand-in for a device DAX device (a regular file: the same mapping and
//! header code, without the durability).

use std::os::unix::fs::symlink;

use topology::{EnvOverrides, Layout, Topology};

use super::*;
use crate::persist::{PersistMode, PersistPolicy};
use crate::region_file::{RegionFile, RegionFileError};

const MIB: u64 = 1 << 20;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// A fake sysfs with device DAX device `name` of `size` bytes: its
/// `bus/dax/devices` entry is a symlink into `devices/…/regionN/`, as on a
/// real machine; `align` and the NUMA nodes are written when given.
fn fake_dax(sys: &Path, name: &str, size: u64, align: Option<&str>, nodes: (&str, &str)) {
    let region = sys.join("devices/ndbus0/region1");
    let dev = region.join(format!("{name}/{name}"));
    write(&dev.join("size"), &format!("{size}\n"));
    if let Some(align) = align {
        write(&dev.join("align"), &format!("{align}\n"));
    }
    write(&dev.join("numa_node"), nodes.0);
    write(&region.join("numa_node"), nodes.1);
    fs::create_dir_all(sys.join("bus/dax/devices")).unwrap();
    symlink(&dev, sys.join("bus/dax/devices").join(name)).unwrap();
}

#[test]
fn slots_follow_one_another_aligned() {
    let (slots, total) = devdax_slots(&[8 * MIB, 4 * MIB, 2 * MIB], 2 * MIB).unwrap();
    assert_eq!(
        slots,
        [(0, 10 * MIB), (10 * MIB, 6 * MIB), (16 * MIB, 4 * MIB)]
    );
    assert_eq!(total, 20 * MIB);
    let (slots, total) = devdax_slots(&[2 * MIB], 1 << 30).unwrap();
    assert_eq!(slots, [(0, 1 << 30)]);
    assert_eq!(total, 1 << 30);
    assert_eq!(devdax_slots(&[], 2 * MIB), Some((vec![], 0)));
    assert_eq!(devdax_slots(&[MIB], 3 * MIB), None, "not a power of two");
    assert_eq!(devdax_slots(&[u64::MAX - 100], 2 * MIB), None);
    assert_eq!(
        devdax_slots(&[1 << 62, 1 << 62, 1 << 62, 1 << 62], 4096),
        None
    );
}

#[test]
fn sysfs_numbers_and_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let roots = SysRoots::at(dir.path().join("sys"), dir.path().join("proc"));
    fake_dax(
        &roots.sys,
        "dax0.0",
        64 * MIB,
        Some("1073741824"),
        ("-1", "1"),
    );
    assert_eq!(dax_size(&roots, "dax0.0").unwrap(), 64 * MIB);
    assert_eq!(dax_align(&roots, "dax0.0").unwrap(), 1 << 30);
    // No node of its own: its region's.
    let node = numa_node_near(&dax_sysfs(&roots, "dax0.0"), &roots.sys);
    assert_eq!(node, Some(1));

    fake_dax(&roots.sys, "dax0.1", 64 * MIB, None, ("0", "1"));
    assert_eq!(dax_align(&roots, "dax0.1").unwrap(), DEFAULT_DEVDAX_ALIGN);
    assert_eq!(
        numa_node_near(&dax_sysfs(&roots, "dax0.1"), &roots.sys),
        Some(0)
    );

    fake_dax(&roots.sys, "dax0.2", 64 * MIB, Some("3000"), ("-1", "-1"));
    let err = dax_align(&roots, "dax0.2").unwrap_err();
    assert!(err.to_string().contains("\"3000\""), "{err}");
    assert_eq!(
        numa_node_near(&dax_sysfs(&roots, "dax0.2"), &roots.sys),
        None
    );
    assert!(dax_size(&roots, "dax9.9").is_err());
    assert_eq!(parse_number("0x200000"), Some(2 * MIB));
    assert_eq!(parse_number("lots"), None);
}

#[test]
fn mountinfo_finds_the_innermost_mount() {
    let text = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
30 22 259:0 / /mnt/pmem0 rw,relatime shared:2 - ext4 /dev/pmem0 rw,dax=always\n\
31 22 259:1 / /mnt/with\\040space rw - ext4 /dev/pmem1p1 rw\n\
garbage line\n\
32 30 0:5 / /mnt/pmem0 rw - tmpfs tmpfs rw\n";
    let mounts = parse_mountinfo(text);
    assert_eq!(mounts.len(), 4);
    assert_eq!(mounts[2].point, Path::new("/mnt/with space"));
    assert_eq!(mounts[1].options, "rw,relatime,rw,dax=always");
    let at = |p: &str| mount_of(&mounts, Path::new(p)).map(|m| m.source.as_str());
    assert_eq!(
        at("/mnt/pmem0/S"),
        Some("tmpfs"),
        "the later mount hides the first"
    );
    assert_eq!(
        at("/mnt/pmem00"),
        Some("/dev/vda"),
        "components, not a string prefix"
    );
    assert_eq!(at("/mnt/with space/x"), Some("/dev/pmem1p1"));
    assert_eq!(at("/srv"), Some("/dev/vda"));
    assert_eq!(mount_of(&[], Path::new("/srv")), None);
}

/// A topology with one server `S`: socket 0 with device `pmem0` (regions
/// `A` 4 MiB and `B` 2 MiB) and socket 1 with `pmem1` (region `C`
/// 2 MiB); `path0` and `path1` are the devices' paths.
fn topology(path0: Option<&Path>, path1: Option<&Path>) -> Topology {
    let path = |p: Option<&Path>| p.map_or(String::new(), |p| format!("path = {:?}", p));
    let text = format!(
        r#"
[pool]
extent_size = "2MiB"
[[servers]]
id = "S"
  [[servers.sockets]]
  id = "0"
    [[servers.sockets.devices]]
    id = "pmem0"
    {}
      [[servers.sockets.devices.regions]]
      id = "A"
      size = "4MiB"
      [[servers.sockets.devices.regions]]
      id = "B"
      size = "2MiB"
  [[servers.sockets]]
  id = "1"
    [[servers.sockets.devices]]
    id = "pmem1"
    {}
      [[servers.sockets.devices.regions]]
      id = "C"
      size = "2MiB"
  [[servers.nics]]
  id = "n0"
  socket = "0"
  listen = "127.0.0.1:0"
[[fabric_devices]]
id = "F"
ports = [{{ id = "p0", listen = "127.0.0.1:0" }}]
links = [{{ server = "S", nic = "n0" }}]
[[clients]]
id = "c"
rnics = [{{ id = "r0", fabric_device = "F" }}]
"#,
        path(path0),
        path(path1)
    );
    let t = Topology::from_toml_str("test.toml", &text, &EnvOverrides::None).unwrap();
    t.validate().unwrap();
    t
}

/// A fake machine: sysfs and procfs trees, a 16 MiB stand-in `dax1.0` for
/// a device DAX device on NUMA node 1, and a directory mounted from pmem0
/// on node 0.
struct Machine {
    dir: tempfile::TempDir,
    roots: SysRoots,
}

impl Machine {
    fn new(dax_size: u64) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let mut roots = SysRoots::at(dir.path().join("sys"), dir.path().join("proc"));
        roots.regular_files_as_devdax = true;
        fake_dax(&roots.sys, "dax1.0", dax_size, None, ("1", "1"));
        let dev = dir.path().join("dev/dax1.0");
        fs::create_dir_all(dev.parent().unwrap()).unwrap();
        fs::File::create(&dev).unwrap().set_len(dax_size).unwrap();
        let mnt = dir.path().join("mnt/pmem0");
        fs::create_dir_all(&mnt).unwrap();
        let real = fs::canonicalize(&mnt).unwrap();
        write(
            &roots.proc.join("self/mountinfo"),
            &format!(
                "22 1 8:0 / / rw - ext4 /dev/sda rw\n\
                 30 22 259:0 / {} rw - ext4 /dev/pmem0 rw,dax=always\n",
                real.display()
            ),
        );
        write(&roots.sys.join("block/pmem0/device/numa_node"), "0\n");
        Machine { dir, roots }
    }

    fn dax(&self) -> PathBuf {
        self.dir.path().join("dev/dax1.0")
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt/pmem0")
    }

    fn data_dir(&self) -> PathBuf {
        let data = self.dir.path().join("data");
        fs::create_dir_all(&data).unwrap();
        data
    }
}

#[test]
fn resolve_names_media_and_numa_nodes() {
    let m = Machine::new(16 * MIB);
    let t = topology(Some(&m.mnt()), Some(&m.dax()));
    let devices = ServerDevices::resolve(&t.servers[0], &m.data_dir(), &m.roots).unwrap();
    let lines = devices.describe();
    assert_eq!(
        lines[0],
        format!(
            "pmem device pmem0 of socket 0: {}, fsdax on pmem0, NUMA node 0, 2 regions",
            m.mnt().display()
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "pmem device pmem1 of socket 1: {}, devdax, NUMA node 1, 1 region",
            m.dax().display()
        )
    );
    assert!(devices.warnings().is_empty(), "{:?}", devices.warnings());
    let Medium::DevDax(dax) = devices.medium(&"1".into(), &"pmem1".into()) else {
        panic!("pmem1 is device DAX: {devices:?}");
    };
    assert_eq!(
        (dax.name.as_str(), dax.size, dax.align),
        ("dax1.0", 16 * MIB, 2 * MIB)
    );
    assert_eq!(dax.slots[0].offset, 0);
    assert_eq!(dax.slots[0].map_len, 4 * MIB);

    // Devices swapped between the sockets: each is on the other's node.
    let t = topology(Some(&m.dax()), Some(&m.mnt()));
    let devices = ServerDevices::resolve(&t.servers[0], &m.data_dir(), &m.roots).unwrap();
    let warnings = devices.warnings();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].starts_with("pmem device pmem0 of socket 0 is on NUMA node 1"),
        "{warnings:?}"
    );

    // No paths: the data dir, on a disk the fake machine knows no node of.
    let t = topology(None, None);
    let devices = ServerDevices::resolve(&t.servers[0], &m.data_dir(), &m.roots).unwrap();
    assert!(
        devices.describe()[1].ends_with("(data dir), files on sda, NUMA node unknown, 1 region"),
        "{:?}",
        devices.describe()
    );
}

#[test]
fn a_device_too_small_fails_naming_size_and_need() {
    let m = Machine::new(8 * MIB);
    let t = topology(Some(&m.dax()), None);
    let err = ServerDevices::resolve(&t.servers[0], &m.data_dir(), &m.roots).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, DeviceError::TooSmall { size, needed: Needed(Some(n)), .. }
        if size == 8 * MIB && n == 10 * MIB),
        "{text}"
    );
    assert!(text.contains("pmem0") && text.contains("dax1.0"), "{text}");
    assert!(
        text.contains("8388608") && text.contains("10485760"),
        "{text}"
    );

    // A regular file is no device DAX device outside tests.
    let mut roots = m.roots.clone();
    roots.regular_files_as_devdax = false;
    let err = ServerDevices::resolve(&t.servers[0], &m.data_dir(), &roots).unwrap_err();
    assert!(matches!(err, DeviceError::NotADevice { .. }), "{err}");
    let t = topology(Some(&m.dir.path().join("nowhere")), None);
    let err = ServerDevices::resolve(&t.servers[0], &m.data_dir(), &m.roots).unwrap_err();
    assert!(matches!(err, DeviceError::Path { .. }), "{err}");
}

/// Opens every region of `t` on `plan`.
fn open_all(
    t: &Topology,
    plan: &ServerDevices,
    format: bool,
) -> Result<Vec<RegionFile>, RegionFileError> {
    let layout = Layout::new(t).unwrap();
    layout
        .entries()
        .iter()
        .map(|e| RegionFile::open_on(plan, e, &PersistPolicy::Auto, format))
        .collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn regions_on_device_dax_keep_headers_and_data() {
    let m = Machine::new(16 * MIB);
    let data = m.data_dir();
    // Stale bytes where region B's data will be: creating it zeroes them.
    {
        use std::os::unix::fs::FileExt;
        let dev = fs::OpenOptions::new().write(true).open(m.dax()).unwrap();
        dev.write_all_at(b"stale", 6 * MIB + HEADER_LEN).unwrap();
    }
    let t = topology(Some(&m.dax()), Some(&m.mnt()));
    let plan = ServerDevices::resolve(&t.servers[0], &data, &m.roots).unwrap();
    let regions = open_all(&t, &plan, false).unwrap();
    assert!(regions.iter().all(|r| r.created));
    let (a, b, c) = (&regions[0], &regions[1], &regions[2]);
    assert_eq!(a.map.mode(), PersistMode::DevDax);
    assert_eq!(a.map.len() as u64, HEADER_LEN + 4 * MIB);
    assert_ne!(c.map.mode(), PersistMode::DevDax);
    assert!(
        m.mnt().join("C.pmem").exists(),
        "C lives in its device's directory"
    );
    assert!(!data.join("A.pmem").exists());
    let mut stale = [1u8; 5];
    b.map.read(HEADER_LEN as usize, &mut stale).unwrap();
    assert_eq!(stale, [0; 5]);
    b.map
        .write_persist(
            HEADER_LEN as usize + 8,
            b"kept",
            topology::CachePolicy::WriteBack,
        )
        .unwrap();
    let keys: Vec<_> = regions.iter().map(|r| r.header.key).collect();
    // The headers sit at the slots' offsets of the device.
    let raw = fs::read(m.dax()).unwrap();
    assert_eq!(&raw[..8], b"PMFABRGN");
    assert_eq!(&raw[6 * MIB as usize..6 * MIB as usize + 8], b"PMFABRGN");
    assert_eq!(&raw[(6 * MIB + HEADER_LEN) as usize + 8..][..4], b"kept");
    assert_eq!(b.map.base_ptr(), b.map.base_ptr());
    drop(regions);

    // Reopened: same keys, next generation, data kept; a rotated key is
    // written through the mapping.
    let regions = open_all(&t, &plan, false).unwrap();
    assert!(
        regions
            .iter()
            .all(|r| !r.created && r.header.generation == 2)
    );
    assert_eq!(
        regions.iter().map(|r| r.header.key).collect::<Vec<_>>(),
        keys
    );
    let mut kept = [0u8; 4];
    regions[1]
        .map
        .read(HEADER_LEN as usize + 8, &mut kept)
        .unwrap();
    assert_eq!(&kept, b"kept");
    let rotated = regions[1].rotate_key().unwrap();
    drop(regions);
    let regions = open_all(&t, &plan, false).unwrap();
    assert_eq!(regions[1].header.key, rotated);
    drop(regions);

    // --format recreates them empty.
    let regions = open_all(&t, &plan, true).unwrap();
    assert!(
        regions
            .iter()
            .all(|r| r.created && r.header.generation == 1)
    );
    regions[1]
        .map
        .read(HEADER_LEN as usize + 8, &mut kept)
        .unwrap();
    assert_eq!(kept, [0; 4]);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn device_dax_refuses_foreign_headers_blank_slots_and_msync() {
    let m = Machine::new(16 * MIB);
    let data = m.data_dir();
    let t = topology(Some(&m.dax()), None);
    let plan = ServerDevices::resolve(&t.servers[0], &data, &m.roots).unwrap();
    drop(open_all(&t, &plan, false).unwrap());

    // The topology swaps A and B's ids: B's slot holds A's header.
    let mut swapped = t.clone();
    let regions = &mut swapped.servers[0].sockets[0].devices[0].regions;
    regions[0].id = "B".into();
    regions[1].id = "A".into();
    let plan_swapped = ServerDevices::resolve(&swapped.servers[0], &data, &m.roots).unwrap();
    let err = open_all(&swapped, &plan_swapped, false).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            &err,
            RegionFileError::Mismatch {
                field: "region id",
                ..
            }
        ),
        "{text}"
    );
    assert!(text.contains("dax1.0@0x0"), "{text}");

    // The namespace was recreated: a listed region's slot is blank.
    {
        use std::os::unix::fs::FileExt;
        let dev = fs::OpenOptions::new().write(true).open(m.dax()).unwrap();
        dev.write_all_at(&[0u8; 4096], 6 * MIB).unwrap();
    }
    let err = open_all(&t, &plan, false).unwrap_err();
    assert!(
        matches!(&err, RegionFileError::Blank { path, .. }
            if path.to_string_lossy().ends_with("dax1.0@0x600000")),
        "{err}"
    );

    // Not a region header at all.
    {
        use std::os::unix::fs::FileExt;
        let dev = fs::OpenOptions::new().write(true).open(m.dax()).unwrap();
        dev.write_all_at(b"something else", 6 * MIB).unwrap();
    }
    let err = open_all(&t, &plan, false).unwrap_err();
    assert!(
        matches!(&err, RegionFileError::NotARegionFile { .. }),
        "{err}"
    );

    let layout = Layout::new(&t).unwrap();
    let err =
        RegionFile::open_on(&plan, &layout.entries()[0], &PersistPolicy::Msync, false).unwrap_err();
    let chain = format!("{:?}", err);
    assert!(chain.contains("DevDaxPolicy"), "{chain}");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_blank_device_dax_slot_without_the_manifest_is_lost_while_others_remain() {
    use crate::missing::{MissingError, open_modes};
    use crate::region_file::OpenMode;
    let m = Machine::new(16 * MIB);
    let data = m.data_dir();
    let t = topology(Some(&m.dax()), None);
    let plan = ServerDevices::resolve(&t.servers[0], &data, &m.roots).unwrap();
    let layout = Layout::new(&t).unwrap();
    let entries: Vec<_> = layout.entries().iter().collect();
    let modes = |create: &[&str]| {
        let create: Vec<String> = create.iter().map(|s| s.to_string()).collect();
        open_modes(
            &t.servers[0].id,
            &plan,
            &entries,
            &PersistPolicy::Auto,
            false,
            &create,
        )
    };
    // A blank device: every region is new.
    assert!(modes(&[]).unwrap().iter().all(|m| *m == OpenMode::Keep));
    drop(open_all(&t, &plan, false).unwrap());

    // B's slot is blank and the manifest is gone too.
    {
        use std::os::unix::fs::FileExt;
        let dev = fs::OpenOptions::new().write(true).open(m.dax()).unwrap();
        dev.write_all_at(&[0u8; 4096], 6 * MIB).unwrap();
    }
    fs::remove_file(data.join(crate::region_file::MANIFEST)).unwrap();
    let err = modes(&[]).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, MissingError::Lost { lost, .. } if lost.len() == 1),
        "{text}"
    );
    assert!(
        text.contains("region B (") && text.contains("dax1.0@0x600000"),
        "{text}"
    );
    assert!(text.contains("--create-missing B"), "{text}");
    let modes = modes(&["B"]).unwrap();
    assert_eq!(
        modes,
        [OpenMode::Keep, OpenMode::CreateMissing, OpenMode::Keep]
    );
}
