// ThreadSanitizer and Debian's absl: libabsl_synchronization is not built with -fsanitize=thread,
// so TSan cannot see absl::Mutex (atomics and futexes inside an uninstrumented library) and
// reports every access it guards as a race. Linked into the TSan build's test binaries, this
// file interposes the out-of-line absl::Mutex, CondVar, Notification and BlockingCounter entry
// points (the executable's definitions win over the shared library's, also for gRPC's calls),
// runs the library's own code through dlsym(RTLD_NEXT) and tells TSan the happens-before edges
// they create: acquire after a lock is taken, release before it is given up.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

// The library's definition of the symbol this file also defines.
template <typename Fn>
Fn Next(const char* mangled) {
  void* p = dlsym(RTLD_NEXT, mangled);
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_shim: %s not found: %s\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

// Resolved once per entry point; `mangled` is the Itanium name of the member function.
#define LAZYRAG_REAL(type, mangled) static const auto real = Next<type>(mangled);

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// absl evaluates a Condition inside the library, with the mutex held: in the waiting thread
// while it reacquires, or in the thread that unlocks. The condition handed to the library
// first acquires the mutex for TSan, so the state it reads is ordered after the last unlock.
struct GuardedCondition {
  const absl::Condition* condition;
  const absl::Mutex* mu;
  static bool Eval(void* self) {
    Acquire(self);  // the waiter built it: see Guard
    auto* g = static_cast<GuardedCondition*>(self);
    Acquire(g->mu);
    const bool holds = g->condition->Eval();
    Release(g->mu);  // what it read is ordered before the next owner of the mutex
    return holds;
  }
};

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using MutexFn = void (*)(Mutex*);
using MutexBoolFn = bool (*)(Mutex*);
using MutexCondFn = void (*)(Mutex*, const Condition&);
using MutexCondDurationFn = bool (*)(Mutex*, const Condition&, Duration);
using MutexCondTimeFn = bool (*)(Mutex*, const Condition&, Time);

#define LAZYRAG_NS "N4absl7debian3"

void Mutex::Lock() {
  LAZYRAG_REAL(MutexFn, "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquire(this);
}
void Mutex::ReaderLock() {
  LAZYRAG_REAL(MutexFn, "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}
bool Mutex::TryLock() {
  LAZYRAG_REAL(MutexBoolFn, "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  LAZYRAG_REAL(MutexBoolFn, "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}
void Mutex::Unlock() {
  LAZYRAG_REAL(MutexFn, "_ZN4absl7debian35Mutex6UnlockEv");
  Release(this);
  real(this);
}
void Mutex::ReaderUnlock() {
  LAZYRAG_REAL(MutexFn, "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}
void Mutex::LockWhen(const Condition& cond) {
  LAZYRAG_REAL(MutexCondFn, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  GuardedCondition g{&cond, this};
  Release(&g);  // another thread may evaluate it (the one that unlocks)
  real(this, Condition(&GuardedCondition::Eval, &g));
  Acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  LAZYRAG_REAL(MutexCondFn, "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  GuardedCondition g{&cond, this};
  Release(&g);  // another thread may evaluate it (the one that unlocks)
  real(this, Condition(&GuardedCondition::Eval, &g));
  Acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  LAZYRAG_REAL(MutexCondDurationFn,
               "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  GuardedCondition g{&cond, this};
  Release(&g);  // another thread may evaluate it (the one that unlocks)
  const bool r = real(this, Condition(&GuardedCondition::Eval, &g), timeout);
  Acquire(this);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  LAZYRAG_REAL(MutexCondTimeFn,
               "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  GuardedCondition g{&cond, this};
  Release(&g);  // another thread may evaluate it (the one that unlocks)
  const bool r = real(this, Condition(&GuardedCondition::Eval, &g), deadline);
  Acquire(this);
  return r;
}
void Mutex::Await(const Condition& cond) {
  LAZYRAG_REAL(MutexCondFn, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Release(this);
  GuardedCondition g{&cond, this};
  Release(&g);  // another thread may evaluate it (the one that unlocks)
  real(this, Condition(&GuardedCondition::Eval, &g));
  Acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  LAZYRAG_REAL(MutexCondDurationFn,
               "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  GuardedCondition g{&cond, this};
  Release(&g);  // another thread may evaluate it (the one that unlocks)
  const bool r = real(this, Condition(&GuardedCondition::Eval, &g), timeout);
  Acquire(this);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  LAZYRAG_REAL(MutexCondTimeFn,
               "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  GuardedCondition g{&cond, this};
  Release(&g);  // another thread may evaluate it (the one that unlocks)
  const bool r = real(this, Condition(&GuardedCondition::Eval, &g), deadline);
  Acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  LAZYRAG_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  LAZYRAG_REAL(bool (*)(CondVar*, Mutex*, Duration),
               "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool r = real(this, mu, timeout);
  Acquire(mu);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  LAZYRAG_REAL(bool (*)(CondVar*, Mutex*, Time),
               "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool r = real(this, mu, deadline);
  Acquire(mu);
  return r;
}

void Notification::Notify() {
  LAZYRAG_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  Release(this);
  real(this);
}
void Notification::WaitForNotification() const {
  LAZYRAG_REAL(void (*)(const Notification*),
               "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  Acquire(this);
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  LAZYRAG_REAL(bool (*)(const Notification*, Duration),
               "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(this, timeout);
  Acquire(this);
  return r;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  LAZYRAG_REAL(bool (*)(const Notification*, Time),
               "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool r = real(this, deadline);
  Acquire(this);
  return r;
}

bool BlockingCounter::DecrementCount() {
  LAZYRAG_REAL(bool (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter14DecrementCountEv");
  Release(this);
  return real(this);
}
void BlockingCounter::Wait() {
  LAZYRAG_REAL(void (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter4WaitEv");
  real(this);
  Acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl
