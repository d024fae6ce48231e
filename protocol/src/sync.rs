//! Locks that a panic cannot wedge. A thread that panics while holding a `Mutex` poisons it;
//! every later `lock()` then fails. Berth's state under a lock is kept consistent at every
//! await-free step (each holder writes whole values), so a poisoned lock's data is still good:
//! [`Locked::locked`] takes it anyway, and [`unpoisoned`] does the same for a condition
//! variable's wait.

use std::sync::{LockResult, Mutex, MutexGuard};

/// `lock()` that answers the guard even after a holder panicked.
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        unpoisoned(self.lock())
    }
}

/// The guard (or a condition variable wait's answer) whether or not the lock was poisoned.
pub fn unpoisoned<G>(r: LockResult<G>) -> G {
    r.unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_answers_its_data() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            *g = 2;
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), 2);
        *m.locked() = 3;
        assert_eq!(*m.locked(), 3);
    }
}
