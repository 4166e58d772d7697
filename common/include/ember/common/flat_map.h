// U64Map: an open-addressing hash map from uint64 keys to small trivially copyable
// values. One flat slot array (key beside value), linear probing at load <= 7/8,
// backward-shift deletion: no per-entry allocation, and iteration order that depends
// only on the sequence of operations (deterministic across processes).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "ember/common/hash.h"
#include "ember/common/huge_pages.h"

namespace ember {

template <typename V>
class U64Map {
  static_assert(std::is_trivially_copyable_v<V>);

 public:
  explicit U64Map(std::size_t expected = 0) { rehash(capacity_for(expected)); }
  U64Map(U64Map&&) noexcept = default;
  U64Map& operator=(U64Map&&) noexcept = default;
  U64Map(const U64Map& o)
      : slots_(make_slots(o.mask_ + 1)),
        mask_(o.mask_),
        size_(o.size_),
        has_empty_key_(o.has_empty_key_),
        empty_key_value_(o.empty_key_value_) {
    std::copy(o.slots_.get(), o.slots_.get() + mask_ + 1, slots_.get());
  }
  U64Map& operator=(const U64Map& o) {
    if (this != &o) *this = U64Map(o);
    return *this;
  }

  // The hash a key is placed by; callers that look up many keys can compute it once
  // and prefetch() its slot ahead of the lookup.
  static std::uint64_t hash(std::uint64_t key) { return mix64(key); }
  void prefetch(std::uint64_t h) const { __builtin_prefetch(&slots_[h & mask_]); }

  std::size_t size() const { return size_ + (has_empty_key_ ? 1 : 0); }
  bool empty() const { return size() == 0; }
  std::size_t capacity() const { return mask_ + 1; }
  // Bytes held by the slot array.
  std::size_t memory_bytes() const { return capacity() * sizeof(Slot); }

  // Pointer to the value of `key`, or nullptr.
  V* find(std::uint64_t key) { return find_hashed(key, hash(key)); }
  V* find_hashed(std::uint64_t key, std::uint64_t h) {
    if (key == kEmpty) return has_empty_key_ ? &empty_key_value_ : nullptr;
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  const V* find(std::uint64_t key) const { return const_cast<U64Map*>(this)->find(key); }
  const V* find_hashed(std::uint64_t key, std::uint64_t h) const { return const_cast<U64Map*>(this)->find_hashed(key, h); }

  // The value of `key`, inserted as `init` if absent; .second tells whether it was.
  std::pair<V*, bool> try_emplace(std::uint64_t key, V init = V{}) { return try_emplace_hashed(key, hash(key), init); }
  std::pair<V*, bool> try_emplace_hashed(std::uint64_t key, std::uint64_t h, V init = V{}) {
    if (key == kEmpty) {
      bool inserted = !has_empty_key_;
      if (inserted) empty_key_value_ = init;
      has_empty_key_ = true;
      return {&empty_key_value_, inserted};
    }
    if ((size_ + 1) * 8 > capacity() * 7) rehash(capacity() * 2);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return {&slots_[i].value, false};
      if (slots_[i].key == kEmpty) {
        slots_[i].key = key;
        slots_[i].value = init;
        ++size_;
        return {&slots_[i].value, true};
      }
    }
  }

  V& operator[](std::uint64_t key) { return *try_emplace(key).first; }

  // Removes `key`; returns whether it was present.
  bool erase(std::uint64_t key) {
    V ignored;
    return erase(key, ignored);
  }
  // Removes `key`, handing its value to `out`; returns whether it was present.
  bool erase(std::uint64_t key, V& out) {
    if (key == kEmpty) {
      out = empty_key_value_;
      return std::exchange(has_empty_key_, false);
    }
    std::size_t i = hash(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == kEmpty) return false;
    }
    out = slots_[i].value;
    // Backward-shift: pull later entries of the probe run into the hole.
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].key == kEmpty) break;
      std::size_t home = hash(slots_[j].key) & mask_;
      // Move j into i unless its home lies cyclically in (i, j].
      bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = kEmpty;
    --size_;
    return true;
  }

  void clear() {
    for (std::size_t i = 0; i <= mask_; ++i) slots_[i].key = kEmpty;
    size_ = 0;
    has_empty_key_ = false;
  }

  // Calls f(key, value&) for every entry.
  template <typename F>
  void for_each(F&& f) {
    if (has_empty_key_) f(kEmpty, empty_key_value_);
    for (std::size_t i = 0; i <= mask_; ++i) {
      if (slots_[i].key != kEmpty) f(slots_[i].key, slots_[i].value);
    }
  }
  template <typename F>
  void for_each(F&& f) const {
    const_cast<U64Map*>(this)->for_each([&](std::uint64_t k, V& v) { f(k, static_cast<const V&>(v)); });
  }

  void reserve(std::size_t n) {
    std::size_t cap = capacity_for(n);
    if (cap > capacity()) rehash(cap);
  }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  // Key and value side by side: a lookup touches one cache line.
  struct Slot {
    std::uint64_t key;
    V value;
  };

  static std::size_t capacity_for(std::size_t n) {
    std::size_t cap = 16;
    while (cap * 7 < n * 8) cap *= 2;
    return cap;
  }

  void rehash(std::size_t cap) {
    auto old = std::move(slots_);
    std::size_t old_cap = old ? mask_ + 1 : 0;
    slots_ = make_slots(cap);
    for (std::size_t i = 0; i < cap; ++i) slots_[i].key = kEmpty;
    mask_ = cap - 1;
    for (std::size_t i = 0; i < old_cap; ++i) {
      if (old[i].key == kEmpty) continue;
      std::size_t j = hash(old[i].key) & mask_;
      while (slots_[j].key != kEmpty) j = (j + 1) & mask_;
      slots_[j] = old[i];
    }
  }

  // Slot arrays come from huge_alloc (large ones on huge pages), uninitialized.
  struct SlotDeleter {
    std::size_t count;
    void operator()(Slot* p) const noexcept { huge_free(p, count * sizeof(Slot)); }
  };
  static std::unique_ptr<Slot[], SlotDeleter> make_slots(std::size_t n) {
    return std::unique_ptr<Slot[], SlotDeleter>(static_cast<Slot*>(huge_alloc(n * sizeof(Slot))), SlotDeleter{n});
  }

  std::unique_ptr<Slot[], SlotDeleter> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
  bool has_empty_key_ = false;
  V empty_key_value_{};
};

}  // namespace ember
