//! A pool's fence progress, readable without its lock.
//!
//! Threads reusing the blocks they freed themselves (`magazine.rs`) tag each
//! free with `epoch` and take the block again once `completed` has reached
//! the tag. With several threads on streams of their own, every thread's
//! frees wait for the same fences: one thread records a fence, and each of
//! the others would take the pool's lock only to ask whether it completed.
//! So the backend also publishes its *oldest* queued fence here (its epoch
//! and events, under a sequence lock), and a thread whose oldest free waits
//! for it asks the driver itself ([`Progress::poll_unlocked`]).
//!
//! Why an answer read here is never wrong in the unsafe direction: the
//! backend makes a fence's events spare (to be recorded again for a later
//! fence) only after it raised `completed` to that fence's epoch. A reader
//! that finds every event it read done, even an event since recorded again,
//! raises `completed` to an epoch that was complete already or that its
//! events say is. Only the oldest fence is published: fences complete in
//! order, and an older one may carry an event of a stream destroyed since
//! that a later one lacks.

use super::streams;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Events of the oldest fence published; a fence on more streams is not
/// (its threads ask under the pool's lock, as before).
pub const PUBLISHED_EVENTS: usize = 16;

pub struct Progress {
    /// Epoch that frees are tagged with now; a fence closes it.
    ///
    /// Raised *before* the events that close the old one are recorded (and
    /// before a synchronisation): a free that still reads the old epoch
    /// happened before that recording, so the work it must wait for was
    /// queued before it too and the fence covers it.
    epoch: AtomicU64,
    /// Every tag up to this is safe to reuse.
    completed: AtomicU64,
    oldest: OldestFence,
    /// Fences a thread completed here (`poll_unlocked`), for the end record.
    completed_unlocked: AtomicU64,
}

/// The backend's oldest queued fence. Written under the pool's lock by its
/// one writer, read by any thread: `seq` is odd while a write is under way.
struct OldestFence {
    seq: AtomicU64,
    /// Its epoch; 0: none published.
    epoch: AtomicU64,
    len: AtomicU64,
    events: [AtomicU64; PUBLISHED_EVENTS],
}

/// What the published oldest fence says of a tag ([`Progress::poll_unlocked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// The tag is complete: its blocks may be handed out again.
    Ready,
    /// A queued fence covers the tag and has not completed: asking again
    /// under the pool's lock would find the same (and record no fence).
    Pending,
    /// Not known here: ask under the pool's lock.
    Unknown,
}

impl Progress {
    pub fn at(epoch: u64, completed: u64) -> Progress {
        Progress {
            epoch: AtomicU64::new(epoch),
            completed: AtomicU64::new(completed),
            oldest: OldestFence {
                seq: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
                len: AtomicU64::new(0),
                events: std::array::from_fn(|_| AtomicU64::new(0)),
            },
            completed_unlocked: AtomicU64::new(0),
        }
    }

    /// Progress whose fences have completed every epoch up to `completed`.
    #[cfg(test)]
    pub fn completed_up_to(completed: u64) -> Progress {
        Progress::at(completed + 1, completed)
    }

    /// The tag of a free now: 0 (reusable at once) while all work goes to one
    /// stream, as the pool's own frees (`free_tag`).
    #[inline]
    pub fn tag_now(&self) -> u64 {
        if streams::MULTI_STREAM.load(Ordering::Acquire) {
            self.epoch.load(Ordering::Acquire)
        } else {
            0
        }
    }

    /// May a block freed with `tag` be handed out again?
    #[inline]
    pub fn is_complete(&self, tag: u64) -> bool {
        tag <= self.completed.load(Ordering::Acquire)
    }

    /// Asks the driver, without the pool's lock, whether the published
    /// oldest fence completed, when it covers `tag`; raises `completed` to
    /// it if so. `query` answers whether an event completed. Not during a
    /// capture: a query of a capturing stream's event is not asked of the
    /// driver.
    pub fn poll_unlocked(&self, tag: u64, query: impl Fn(u64) -> bool) -> Reuse {
        if self.is_complete(tag) {
            return Reuse::Ready;
        }
        if streams::any_capture() {
            return Reuse::Unknown;
        }
        let mut events = [0u64; PUBLISHED_EVENTS];
        let Some((epoch, len)) = self.read_oldest(&mut events) else { return Reuse::Unknown };
        if epoch < tag {
            return Reuse::Unknown; // a later fence, perhaps not yet recorded, closes the tag
        }
        if !events[..len].iter().all(|&e| query(e)) {
            return Reuse::Pending;
        }
        if self.complete_up_to(epoch) {
            // Once a fence, by the thread that saw it first.
            self.completed_unlocked.fetch_add(1, Ordering::Relaxed);
        }
        Reuse::Ready
    }

    pub fn completed_unlocked(&self) -> u64 {
        self.completed_unlocked.load(Ordering::Relaxed)
    }

    /// Copies the published fence's events into `events`; its (epoch,
    /// number of events), or None when none is published or a write is
    /// under way.
    fn read_oldest(&self, events: &mut [u64; PUBLISHED_EVENTS]) -> Option<(u64, usize)> {
        let o = &self.oldest;
        let before = o.seq.load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        let epoch = o.epoch.load(Ordering::Relaxed);
        let len = (o.len.load(Ordering::Relaxed) as usize).min(PUBLISHED_EVENTS);
        for (to, from) in events.iter_mut().zip(&o.events[..len]) {
            *to = from.load(Ordering::Relaxed);
        }
        // The reads above happen before the check below (a seqlock's reader).
        fence(Ordering::Acquire);
        (epoch != 0 && o.seq.load(Ordering::Relaxed) == before).then_some((epoch, len))
    }

    /// Publishes the backend's oldest queued fence (None: the queue is
    /// empty, or its front is not to be polled here). The pool's lock is
    /// held: there is one writer at a time.
    pub fn publish_oldest(&self, front: Option<(u64, &[u64])>) {
        let front = front.filter(|(_, events)| events.len() <= PUBLISHED_EVENTS);
        let o = &self.oldest;
        let (epoch, events) = front.unwrap_or((0, &[]));
        if epoch == 0 && o.epoch.load(Ordering::Relaxed) == 0 {
            return; // nothing was published and nothing is
        }
        let seq = o.seq.load(Ordering::Relaxed);
        o.seq.store(seq + 1, Ordering::Relaxed);
        // The odd sequence is seen before any of the writes below.
        fence(Ordering::Release);
        o.epoch.store(epoch, Ordering::Relaxed);
        o.len.store(events.len() as u64, Ordering::Relaxed);
        for (to, &from) in o.events.iter().zip(events) {
            to.store(from, Ordering::Relaxed);
        }
        o.seq.store(seq + 2, Ordering::Release);
    }

    /// Raises the epoch that frees are tagged with; returns the one it closes.
    pub fn next_epoch(&self) -> u64 {
        // The backend is the only writer, under the pool's lock.
        let closing = self.epoch.load(Ordering::Relaxed);
        self.epoch.store(closing + 1, Ordering::SeqCst);
        closing
    }

    /// Raises `completed` to `epoch`; whether this call raised it.
    pub fn complete_up_to(&self, epoch: u64) -> bool {
        self.completed.fetch_max(epoch, Ordering::Release) < epoch
    }

    /// Read under the pool's lock, by the only writer: no ordering needed.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn tagged(epoch: u64) -> Progress {
        Progress::at(epoch, 0)
    }

    #[test]
    fn nothing_published_is_asked_under_the_lock() {
        let p = tagged(3);
        assert_eq!(p.poll_unlocked(2, |_| true), Reuse::Unknown);
        assert!(!p.is_complete(2));
    }

    #[test]
    fn a_completed_oldest_fence_completes_the_tags_it_covers() {
        let p = tagged(4);
        p.publish_oldest(Some((3, &[7, 8])));
        assert_eq!(p.poll_unlocked(2, |e| e == 7 || e == 8), Reuse::Ready);
        assert!(p.is_complete(3));
        assert!(!p.is_complete(4));
        assert_eq!(p.poll_unlocked(3, |_| panic!("complete: nothing to ask")), Reuse::Ready);
        assert_eq!(p.completed_unlocked(), 1);
    }

    #[test]
    fn an_event_not_done_leaves_the_tag_pending() {
        let p = tagged(4);
        p.publish_oldest(Some((3, &[7, 8])));
        assert_eq!(p.poll_unlocked(3, |e| e == 7), Reuse::Pending);
        assert!(!p.is_complete(3));
    }

    #[test]
    fn a_fence_older_than_the_tag_says_nothing_of_it() {
        let p = tagged(6);
        p.publish_oldest(Some((3, &[7])));
        assert_eq!(p.poll_unlocked(5, |_| true), Reuse::Unknown);
        assert!(!p.is_complete(5), "completing epoch 3 does not complete epoch 5");
        assert!(!p.is_complete(3), "nothing raised: the tag was not covered");
    }

    #[test]
    fn a_fence_with_more_events_than_published_is_not_published() {
        let p = tagged(4);
        let many: Vec<u64> = (1..=PUBLISHED_EVENTS as u64 + 1).collect();
        p.publish_oldest(Some((3, &many)));
        assert_eq!(p.poll_unlocked(3, |_| true), Reuse::Unknown);
        p.publish_oldest(Some((3, &many[..2])));
        p.publish_oldest(None);
        assert_eq!(p.poll_unlocked(3, |_| true), Reuse::Unknown);
    }

    /// A reader never sees one fence's epoch with another's events: each
    /// fence published here has events that all name its epoch.
    #[test]
    fn readers_see_whole_fences_while_the_writer_publishes() {
        let p = std::sync::Arc::new(tagged(u64::MAX));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let reader = {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                loop {
                    // Read before the stop is asked: the last fence stays
                    // published, so a reader that starts late sees it.
                    let stopping = stop.load(Ordering::Acquire);
                    let mut events = [0; PUBLISHED_EVENTS];
                    if let Some((epoch, len)) = p.read_oldest(&mut events) {
                        assert_eq!(len as u64, epoch % PUBLISHED_EVENTS as u64 + 1);
                        assert!(events[..len].iter().all(|&e| e == epoch), "{epoch}: {events:?}");
                        seen += 1;
                    }
                    if stopping {
                        return seen;
                    }
                }
            })
        };
        for epoch in 1..200_000u64 {
            let events = vec![epoch; (epoch % PUBLISHED_EVENTS as u64 + 1) as usize];
            p.publish_oldest(Some((epoch, &events)));
        }
        stop.store(true, Ordering::Release);
        assert!(reader.join().unwrap() > 0);
    }
}
