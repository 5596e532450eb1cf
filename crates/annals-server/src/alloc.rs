//! The process's memory allocator: mimalloc for small blocks, the system's for large ones.
//!
//! The server's request path (hyper, h2, tonic) allocates and frees many small buffers per
//! request, and glibc's malloc spent a tenth of the server's time on them (consolidating and
//! unlinking free chunks), which mimalloc does not (docs/DECISIONS.md, R17). Large blocks stay with
//! glibc, which maps them from the system and grows them with `mremap`: the index's per-event
//! arrays and posting lists double in place, where mimalloc would copy hundreds of megabytes
//! into freshly touched pages (on a virtual machine, a host page fault per page).

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes go to the system allocator.
const LARGE: usize = 1 << 20;

/// mimalloc's `purge_delay` option (its index in `mi_option_t`, the same in mimalloc 2 and 3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

pub struct Split;

fn large(size: usize) -> bool {
    size >= LARGE
}

// SAFETY: every block is freed or resized by the allocator that made it: which one is decided
// by the block's size alone, and `realloc` moves a block across when its size crosses `LARGE`.
unsafe impl GlobalAlloc for Split {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout goes to the allocator that owns blocks of its size.
        unsafe {
            if large(layout.size()) {
                System.alloc(layout)
            } else {
                mimalloc::MiMalloc.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            if large(layout.size()) {
                System.alloc_zeroed(layout)
            } else {
                mimalloc::MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the block was made with this layout, so by the allocator its size selects.
        unsafe {
            if large(layout.size()) {
                System.dealloc(ptr, layout)
            } else {
                mimalloc::MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (large(layout.size()), large(new_size)) {
            // SAFETY: the block stays with the allocator that made it.
            (true, true) => unsafe { System.realloc(ptr, layout, new_size) },
            // SAFETY: as above.
            (false, false) => unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) },
            // SAFETY: the caller guarantees `new_size` with the old alignment is a valid
            // layout; the new block is made by the allocator of its size, the old one's bytes
            // copied (as many as both hold) and the old block freed by its own allocator.
            _ => unsafe {
                let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            },
        }
    }
}

/// Freed memory goes back to the system after a second unused rather than mimalloc's 10 ms:
/// on virtual machines that hand freed guest pages back to the host, touching memory again
/// costs a host page fault per page, and buffers freed and reallocated within milliseconds
/// paid it over and over.
pub fn tune() {
    // SAFETY: sets one of mimalloc's options to a value its documentation allows.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 1000) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// Goal: a block moved between the small-block and the large-block allocator by a resize keeps
    /// its bytes, and a large zeroed block reads as zeros. Method: a small block grown past the
    /// boundary, grown again, shrunk back below it, its bytes checked.
    #[test]
    fn blocks_keep_their_bytes_across_the_large_boundary() {
        let alloc = Split;
        let layout = Layout::from_size_align(MIB / 2, 16).expect("layout");
        // SAFETY: every block is used within its size and freed with the layout it has.
        unsafe {
            let small = alloc.alloc(layout);
            assert!(!small.is_null());
            for i in 0..layout.size() {
                *small.add(i) = (i % 251) as u8;
            }
            // Small to large (mimalloc to the system), large to larger, large to small.
            let large = alloc.realloc(small, layout, 3 * MIB);
            assert!(!large.is_null());
            let larger = alloc.realloc(
                large,
                Layout::from_size_align(3 * MIB, 16).unwrap(),
                9 * MIB,
            );
            assert!(!larger.is_null());
            *larger.add(9 * MIB - 1) = 7;
            let back = alloc.realloc(
                larger,
                Layout::from_size_align(9 * MIB, 16).unwrap(),
                MIB / 4,
            );
            assert!(!back.is_null());
            for i in 0..MIB / 4 {
                assert_eq!(*back.add(i), (i % 251) as u8, "byte {i}");
            }
            alloc.dealloc(back, Layout::from_size_align(MIB / 4, 16).unwrap());
            let zeroed_layout = Layout::from_size_align(5 * MIB, 4096).unwrap();
            let zeroed = alloc.alloc_zeroed(zeroed_layout);
            assert!(!zeroed.is_null());
            assert!((0..5 * MIB).step_by(4093).all(|i| *zeroed.add(i) == 0));
            alloc.dealloc(zeroed, zeroed_layout);
        }
    }
}
