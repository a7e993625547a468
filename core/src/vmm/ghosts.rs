//! Ghosts: the old mappings of pages taken while cooling (see the module
//! documentation of `vmm`). A page that queued work may still touch where it
//! is can be mapped elsewhere at once, its reuse ordered as reuse in place
//! would be; its old mapping stays until that work finished, and no block is
//! placed over it meanwhile.

use super::pages::Slot;
use super::{Cooling, PageBackend, VmmPool};

/// An old mapping of a page taken while cooling.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ghost {
    /// The page's unmap tag: the ghost goes once it finished.
    pub tag: u64,
    pub size: u64,
    pub small: bool,
    /// Where the page is mapped now.
    pub owner: u64,
}

impl<B: PageBackend> VmmPool<B> {
    /// Takes the oldest cooling page of `size` bytes: its mapping stays, as
    /// a ghost. Returns the ghost's address and the page's handle.
    pub(super) fn cooling_page(&mut self, size: u64) -> Option<(u64, u64)> {
        if !(self.config.remap_idle && self.config.alias_cooling) {
            return None;
        }
        let mut i = 0;
        while i < self.cooling.len() {
            let Cooling { tag, addr: a, small, .. } = self.cooling[i];
            let Some(handle) = self.still_cooling(&self.cooling[i]) else {
                self.cooling.remove(i);
                continue;
            };
            if self.config.page(small) != size {
                i += 1; // only with two page sizes
                continue;
            }
            self.cooling.remove(i);
            self.pages.remove(a);
            if self.doomed.remove(&a).is_some() {
                self.doomed_bytes -= size;
            }
            self.stats.idle_bytes.dec(size);
            self.stats.cooling_bytes.dec(size);
            // Owned by the page's old place until it is mapped at the new one.
            self.add_ghost(a, Ghost { tag, size, small, owner: a });
            self.stats.num_remaps += 1;
            self.stats.num_aliases += 1;
            return Some((a, handle));
        }
        None
    }

    fn add_ghost(&mut self, a: u64, g: Ghost) {
        self.ghosts.insert(a, g);
        self.ghosts_by_tag.insert((g.tag, a));
        self.ghosts_by_owner.insert((g.owner, a));
    }

    /// The ghosts of the page mapped at `owner`.
    fn ghosts_of(&self, owner: u64) -> Vec<u64> {
        self.ghosts_by_owner.range((owner, 0)..=(owner, u64::MAX)).map(|&(_, g)| g).collect()
    }

    /// The page taken from `from` while cooling is mapped at `to` now: its
    /// ghosts (the one at `from` and those it had) are that page's.
    pub(super) fn adopt_ghosts(&mut self, from: u64, to: u64) {
        for g in self.ghosts_of(from) {
            self.ghosts_by_owner.remove(&(from, g));
            self.ghosts_by_owner.insert((to, g));
            self.ghosts.get_mut(&g).expect("indexed").owner = to;
        }
    }

    /// A page taken while cooling could not be mapped at its new place: it
    /// is an idle cooling page at its old place again, with its ghosts.
    pub(super) fn restore_ghost(&mut self, a: u64, handle: u64) {
        let Some(g) = self.ghosts.remove(&a) else { return };
        self.ghosts_by_tag.remove(&(g.tag, a));
        self.ghosts_by_owner.remove(&(a, a));
        self.pages.insert(a, Slot { handle, refs: 0, cooling: Some(g.tag) });
        self.stats.idle_bytes.inc(g.size);
        self.stats.cooling_bytes.inc(g.size);
        self.cool(g.tag, a, g.small);
    }

    /// Makes room at the ghost at `a` for a new page: waits for the GPU when
    /// it may still use the page there (false when it cannot wait now).
    #[cold]
    pub(super) fn clear_ghost(&mut self, a: u64) -> bool {
        let tag = self.ghosts[&a].tag;
        if !self.tag_done(tag) {
            if !self.wait_until_finished(tag) {
                return false;
            }
            self.stats.num_ghost_waits += 1;
        }
        self.drop_ghost(a);
        true
    }

    /// Waits until the GPU finished the work before `tag`: up to the fence
    /// covering it, or for everything where that wait fails. False when it
    /// cannot wait now (a capture).
    fn wait_until_finished(&mut self, tag: u64) -> bool {
        if self.backend.wait_finished(tag) {
            self.finished_upto = self.finished_upto.max(Some(tag));
            return true;
        }
        self.cool_down()
    }

    /// Unmaps the ghost at `a` (its work is done).
    pub(super) fn drop_ghost(&mut self, a: u64) {
        let Some(g) = self.ghosts.remove(&a) else { return };
        self.ghosts_by_tag.remove(&(g.tag, a));
        self.ghosts_by_owner.remove(&(g.owner, a));
        self.backend.unmap(a, g.size);
        self.stats.num_unmaps += 1;
    }

    /// Unmaps the ghosts of the idle page at `owner`, which is about to be
    /// unmapped itself. Their tags are older than the one it cooled with
    /// there, so their work is done; the GPU is asked, and waited for if not.
    pub(super) fn drop_ghosts_of(&mut self, owner: u64) {
        if self.ghosts.is_empty() {
            return;
        }
        let mine = self.ghosts_of(owner);
        let newest = mine.iter().map(|g| self.ghosts[g].tag).max();
        if let Some(t) = newest.filter(|&t| !self.tag_done(t)) {
            self.wait_until_finished(t);
        }
        for g in mine {
            self.drop_ghost(g);
        }
    }
}
