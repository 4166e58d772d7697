// U64Map: an open-addressing hash map from uint64 keys to small trivially copyable
// values. Two flat arrays (keys, values), linear probing, backward-shift deletion: no
// per-entry allocation, about 12-16 bytes per slot, and iteration order that depends
// only on the sequence of operations (deterministic across processes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "ember/common/hash.h"

namespace ember {

template <typename V>
class U64Map {
  static_assert(std::is_trivially_copyable_v<V>);

 public:
  explicit U64Map(std::size_t expected = 0) { rehash(capacity_for(expected)); }

  std::size_t size() const { return size_ + (has_empty_key_ ? 1 : 0); }
  bool empty() const { return size() == 0; }
  std::size_t capacity() const { return mask_ + 1; }
  // Bytes held by the table arrays.
  std::size_t memory_bytes() const { return capacity() * (sizeof(std::uint64_t) + sizeof(V)); }

  // Pointer to the value of `key`, or nullptr.
  V* find(std::uint64_t key) {
    if (key == kEmpty) return has_empty_key_ ? &empty_key_value_ : nullptr;
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  const V* find(std::uint64_t key) const { return const_cast<U64Map*>(this)->find(key); }

  // The value of `key`, inserted as `init` if absent; .second tells whether it was.
  std::pair<V*, bool> try_emplace(std::uint64_t key, V init = V{}) {
    if (key == kEmpty) {
      bool inserted = !has_empty_key_;
      if (inserted) empty_key_value_ = init;
      has_empty_key_ = true;
      return {&empty_key_value_, inserted};
    }
    if ((size_ + 1) * 8 > capacity() * 7) rehash(capacity() * 2);
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return {&vals_[i], false};
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        vals_[i] = init;
        ++size_;
        return {&vals_[i], true};
      }
    }
  }

  V& operator[](std::uint64_t key) { return *try_emplace(key).first; }

  // Removes `key`; returns whether it was present.
  bool erase(std::uint64_t key) {
    if (key == kEmpty) return std::exchange(has_empty_key_, false);
    std::size_t i = slot(key);
    for (;; i = (i + 1) & mask_) {
      if (keys_[i] == key) break;
      if (keys_[i] == kEmpty) return false;
    }
    // Backward-shift: pull later entries of the probe run into the hole.
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (keys_[j] == kEmpty) break;
      std::size_t home = slot(keys_[j]);
      // Move j into i unless its home lies cyclically in (i, j].
      bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) {
        keys_[i] = keys_[j];
        vals_[i] = vals_[j];
        i = j;
      }
    }
    keys_[i] = kEmpty;
    --size_;
    return true;
  }

  void clear() {
    for (std::size_t i = 0; i <= mask_; ++i) keys_[i] = kEmpty;
    size_ = 0;
    has_empty_key_ = false;
  }

  // Calls f(key, value&) for every entry.
  template <typename F>
  void for_each(F&& f) {
    if (has_empty_key_) f(kEmpty, empty_key_value_);
    for (std::size_t i = 0; i <= mask_; ++i) {
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
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

  static std::size_t capacity_for(std::size_t n) {
    std::size_t cap = 16;
    while (cap * 7 < n * 8) cap *= 2;
    return cap;
  }
  std::size_t slot(std::uint64_t key) const { return static_cast<std::size_t>(mix64(key)) & mask_; }

  void rehash(std::size_t cap) {
    auto old_keys = std::move(keys_);
    auto old_vals = std::move(vals_);
    std::size_t old_cap = old_keys ? mask_ + 1 : 0;
    keys_ = std::make_unique_for_overwrite<std::uint64_t[]>(cap);
    vals_ = std::make_unique_for_overwrite<V[]>(cap);
    for (std::size_t i = 0; i < cap; ++i) keys_[i] = kEmpty;
    mask_ = cap - 1;
    for (std::size_t i = 0; i < old_cap; ++i) {
      if (old_keys[i] == kEmpty) continue;
      std::size_t j = slot(old_keys[i]);
      while (keys_[j] != kEmpty) j = (j + 1) & mask_;
      keys_[j] = old_keys[i];
      vals_[j] = old_vals[i];
    }
  }

  std::unique_ptr<std::uint64_t[]> keys_;
  std::unique_ptr<V[]> vals_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
  bool has_empty_key_ = false;
  V empty_key_value_{};
};

}  // namespace ember
