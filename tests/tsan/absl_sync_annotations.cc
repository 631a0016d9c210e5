// File: tests/tsan/absl_sync_annotations.cc
//
// Linked only into scripts/sanitize.sh's ThreadSanitizer build (CMake option
// ATTENTION_TSAN_ABSL_SHIM). Debian's Abseil is not built with TSan, so the
// futex-based absl::Mutex, CondVar and Notification in
// libabsl_synchronization.so are invisible to it: without help TSan sees no
// happens-before edge between a thread that unlocks an absl::Mutex and the
// next that locks it, and reports a race on everything the mutex guards.
//
// This file defines those entry points in the executable, which the dynamic
// linker prefers over the library's (for our code and for gRPC's calls into
// Abseil alike). Each calls the library's own function, found with
// dlsym(RTLD_NEXT), and tells TSan what it did: __tsan_release on the mutex
// (or notification) before it is given up, __tsan_acquire after it is taken.
// Nothing else changes: locking still happens in Abseil.
//
// Thread-safe: the real functions are looked up once, on first use.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <typeinfo>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

// The library's definition of `Class::member` (its Itanium-mangled name is
// built from typeid, so the Abseil inline namespace needs no spelling out;
// a const member's name has a K after the N).
template <typename Fn>
Fn Real(const std::type_info& type, const char* member_and_args, bool const_member) {
  std::string name = type.name();  // "N4absl7debian35MutexE"
  name.pop_back();                 // Drop the closing 'E' of the nested name.
  name = (const_member ? "_ZNK" : "_ZN") + name.substr(1) + member_and_args;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_sync_annotations: no %s in the loaded Abseil\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

#define ATTN_REAL(Class, member_and_args, Fn) \
  static const auto real = Real<Fn>(typeid(absl::Class), member_and_args, false)
#define ATTN_REAL_CONST(Class, member_and_args, Fn) \
  static const auto real = Real<Fn>(typeid(absl::Class), member_and_args, true)

void Acquire(const void* sync) { __tsan_acquire(const_cast<void*>(sync)); }
void Release(const void* sync) { __tsan_release(const_cast<void*>(sync)); }

// A Condition evaluated as a critical section of `mu`. Abseil evaluates a
// waiter's condition with the mutex held, but on whichever thread holds it
// (often the one unlocking, inside Unlock after our Release); without this
// TSan sees those reads outside any critical section.
struct AnnotatedCondition {
  const absl::Condition* cond;
  const absl::Mutex* mu;

  static bool Eval(void* arg) {
    const auto* self = static_cast<const AnnotatedCondition*>(arg);
    Acquire(self->mu);
    const bool result = self->cond->Eval();
    Release(self->mu);
    return result;
  }
  absl::Condition Wrapped() { return absl::Condition(&AnnotatedCondition::Eval, this); }
};

// Abseil's own deadlock detector (on in Debian's build) keeps a lock graph
// in libabsl_graphcycles_internal under a spinlock TSan cannot see, and every
// gRPC lock feeds it: TSan then reports the graph's memmoves racing each
// other. Lock-order checking is TSan's job in this build, so Abseil's is off.
const bool kAbseilDeadlockDetectionOff = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  ATTN_REAL(Mutex, "4LockEv", void (*)(Mutex*));
  real(this);
  Acquire(this);
}

void Mutex::ReaderLock() {
  ATTN_REAL(Mutex, "10ReaderLockEv", void (*)(Mutex*));
  real(this);
  Acquire(this);
}

bool Mutex::TryLock() {
  ATTN_REAL(Mutex, "7TryLockEv", bool (*)(Mutex*));
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  ATTN_REAL(Mutex, "13ReaderTryLockEv", bool (*)(Mutex*));
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::Unlock() {
  ATTN_REAL(Mutex, "6UnlockEv", void (*)(Mutex*));
  Release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  ATTN_REAL(Mutex, "12ReaderUnlockEv", void (*)(Mutex*));
  Release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  ATTN_REAL(Mutex, "8LockWhenERKNS0_9ConditionE", void (*)(Mutex*, const Condition&));
  real(this, AnnotatedCondition{&cond, this}.Wrapped());
  Acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  ATTN_REAL(Mutex, "14ReaderLockWhenERKNS0_9ConditionE", void (*)(Mutex*, const Condition&));
  real(this, AnnotatedCondition{&cond, this}.Wrapped());
  Acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  ATTN_REAL(Mutex, "19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
            bool (*)(Mutex*, const Condition&, absl::Duration));
  const bool met = real(this, AnnotatedCondition{&cond, this}.Wrapped(), timeout);
  Acquire(this);  // Held on return either way.
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  ATTN_REAL(Mutex, "20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
            bool (*)(Mutex*, const Condition&, absl::Time));
  const bool met = real(this, AnnotatedCondition{&cond, this}.Wrapped(), deadline);
  Acquire(this);
  return met;
}

void Mutex::Await(const Condition& cond) {
  ATTN_REAL(Mutex, "5AwaitERKNS0_9ConditionE", void (*)(Mutex*, const Condition&));
  Release(this);  // Await gives the mutex up while it waits.
  real(this, AnnotatedCondition{&cond, this}.Wrapped());
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  ATTN_REAL(Mutex, "16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE",
            bool (*)(Mutex*, const Condition&, absl::Duration));
  Release(this);
  const bool met = real(this, AnnotatedCondition{&cond, this}.Wrapped(), timeout);
  Acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  ATTN_REAL(Mutex, "17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
            bool (*)(Mutex*, const Condition&, absl::Time));
  Release(this);
  const bool met = real(this, AnnotatedCondition{&cond, this}.Wrapped(), deadline);
  Acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  ATTN_REAL(CondVar, "4WaitEPNS0_5MutexE", void (*)(CondVar*, Mutex*));
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  ATTN_REAL(CondVar, "15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE",
            bool (*)(CondVar*, Mutex*, absl::Duration));
  Release(mu);
  const bool timed_out = real(this, mu, timeout);
  Acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  ATTN_REAL(CondVar, "16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE",
            bool (*)(CondVar*, Mutex*, absl::Time));
  Release(mu);
  const bool timed_out = real(this, mu, deadline);
  Acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  ATTN_REAL(Notification, "6NotifyEv", void (*)(Notification*));
  Release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  ATTN_REAL_CONST(Notification, "19WaitForNotificationEv", void (*)(const Notification*));
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  ATTN_REAL_CONST(Notification, "30WaitForNotificationWithTimeoutENS0_8DurationE",
                  bool (*)(const Notification*, absl::Duration));
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  ATTN_REAL_CONST(Notification, "31WaitForNotificationWithDeadlineENS0_4TimeE",
                  bool (*)(const Notification*, absl::Time));
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
