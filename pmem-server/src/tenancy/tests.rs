use topology::records::{Control, EntryKind, EntryState, NameControl, NameState, owned_key};
use topology::{AccessKey, PmemAddr, RegionIndex, RegionMeta};

use super::*;

const C1: Asker = Asker::Client(1);
const C2: Asker = Asker::Client(2);

fn entry(state: EntryState, owner: u16) -> u64 {
    Control {
        state,
        kind: EntryKind::Head,
        owner,
        generation: 3,
    }
    .encode()
}

fn name(state: NameState, owner: u16) -> u64 {
    NameControl {
        state,
        generation: 1,
        owner,
        hash: 0xabcd,
    }
    .encode()
}

#[test]
fn page_table_entries_change_only_by_their_owner() {
    let free = entry(EntryState::Free, 0);
    let (reserved1, live1) = (entry(EntryState::Reserved, 1), entry(EntryState::Live, 1));
    // A claim for itself, then its own transitions.
    assert_eq!(entry_control(C1, free, reserved1), Ok(()));
    assert_eq!(entry_control(C1, reserved1, live1), Ok(()));
    assert_eq!(
        entry_control(C1, live1, entry(EntryState::Freeing, 1)),
        Ok(())
    );
    assert_eq!(entry_control(C1, live1, free), Ok(()));
    // Nobody claims for another, frees another's, or takes it over.
    assert_eq!(entry_control(C2, free, reserved1), Err(Refusal::NotOwner));
    assert_eq!(entry_control(C2, live1, free), Err(Refusal::NotOwner));
    assert_eq!(
        entry_control(C2, live1, entry(EntryState::Freeing, 1)),
        Err(Refusal::NotOwner)
    );
    assert_eq!(
        entry_control(C2, reserved1, entry(EntryState::Reserved, 2)),
        Err(Refusal::NotOwner)
    );
    assert_eq!(entry_control(C1, free, 0xff), Err(Refusal::BadRecord));
    // Without authentication nobody is known: everything goes.
    assert_eq!(entry_control(Asker::Unknown, live1, free), Ok(()));
}

#[test]
fn name_entries_change_only_by_their_owner() {
    let free = name(NameState::Free, 1);
    let live = name(NameState::Live, 1);
    assert_eq!(name_control(C1, free, name(NameState::Claiming, 1)), Ok(()));
    assert_eq!(name_control(C1, live, name(NameState::Removing, 1)), Ok(()));
    assert_eq!(
        name_control(C2, live, name(NameState::Removing, 1)),
        Err(Refusal::NotOwner)
    );
    assert_eq!(
        name_control(C2, free, name(NameState::Claiming, 1)),
        Err(Refusal::NotOwner)
    );
    assert_eq!(name_control(C2, free, name(NameState::Claiming, 2)), Ok(()));
}

#[test]
fn keys_go_in_on_free_extents_and_out_only_by_their_owner() {
    let k1 = owned_key(1, 0x1234).get();
    let k2 = owned_key(2, 0x5678).get();
    // Installing a key zeroes the extent.
    assert_eq!(extent_key(C1, false, 0, k1), Ok(true));
    assert_eq!(extent_key(C1, false, k1, 0), Ok(false));
    assert_eq!(extent_key(C2, false, 0, k1), Err(Refusal::NotOwner));
    assert_eq!(extent_key(C2, false, k1, 0), Err(Refusal::NotOwner));
    assert_eq!(extent_key(C2, false, k1, k2), Err(Refusal::NotOwner));
    // A key that names no owner is not installed by a known client.
    assert_eq!(extent_key(C1, false, 0, 42), Err(Refusal::NotOwner));
    assert_eq!(extent_key(Asker::Unknown, false, 0, 42), Ok(true));
    // Reserved extents keep 0.
    assert_eq!(extent_key(C1, true, 0, k1), Err(Refusal::ExtentInUse));
}

#[test]
fn bitmap_bits_clear_only_for_released_extents() {
    let region = RegionMeta {
        region: RegionIndex(0),
        start: PmemAddr(0),
        extents: 70,
        reserved: 2,
        key: AccessKey(9),
    };
    let keyed = |extent: u64| if extent == 5 { 77 } else { 0 };
    // Setting bits is a claim: anyone.
    assert_eq!(bitmap(&region, 0, 0b11, 0b111_1111, keyed), Ok(()));
    // Clearing a released extent's bit.
    assert_eq!(bitmap(&region, 0, 0b1111, 0b0111, keyed), Ok(()));
    // Not while its key is installed, nor for reserved or padding bits.
    assert_eq!(
        bitmap(&region, 0, 0b10_0011, 0b00_0011, keyed),
        Err(Refusal::ExtentInUse)
    );
    assert_eq!(
        bitmap(&region, 0, 0b11, 0b01, keyed),
        Err(Refusal::ExtentInUse)
    );
    assert_eq!(
        bitmap(&region, 1, u64::MAX, u64::MAX >> 1, keyed),
        Err(Refusal::ExtentInUse)
    );
}

#[test]
fn a_slab_header_and_bitmaps_change_only_by_the_slab_owner() {
    let extent = 2u64 << 20;
    let classes = Classes::new(extent);
    // A slab of 512 KiB objects (class 13) owned by client 1, in the
    // region's third extent: its header and bitmaps are the first 80 bytes.
    let start = 2 * extent;
    let slab = Slab {
        start,
        key: records::slab_key(1, 0x1234).get(),
        header: records::SlabHeader {
            retiring: false,
            class: 13,
            used: 1,
        }
        .encode(),
    };
    // Its owner takes and frees objects: header, claimed and live words.
    for at in [0, 64, 72] {
        assert_eq!(slab_header(C1, &classes, &slab, start + at, 8), Ok(()));
    }
    // Another client may neither, nor write over them.
    for at in [0, 64, 72] {
        assert_eq!(
            slab_header(C2, &classes, &slab, start + at, 8),
            Err(Refusal::NotOwner)
        );
    }
    assert_eq!(
        slab_header(C2, &classes, &slab, start - 8, 16),
        Err(Refusal::NotOwner)
    );
    // The objects are data: whoever holds the key writes them.
    let object = start + (512 << 10);
    assert_eq!(slab_header(C2, &classes, &slab, object, 4096), Ok(()));
    assert_eq!(slab_header(C2, &classes, &slab, start + 80, 8), Ok(()));
    // A header word that names no class guards the largest header.
    let unset = Slab { header: 0, ..slab };
    assert_eq!(
        slab_header(C2, &classes, &unset, start + 4096, 8),
        Err(Refusal::NotOwner)
    );
    // Without authentication nobody is known.
    assert_eq!(
        slab_header(Asker::Unknown, &classes, &slab, start, 8),
        Ok(())
    );
}
