// Typed identities, and the containers they index.
//
// A model numbers its parameters and its modules 0..n-1 in the order it
// declares them; the shard toolkit numbers its gather groups and reduce
// buckets the same way. Each kind of number is its own enum class, so a
// module id cannot index the parameters by mistake, and the containers an
// id indexes take the id itself:
//
//   IdVector<ParamId, Shape> shapes;   // shapes[p] with p a ParamId
//   for (ParamId p : shapes.ids()) ...
//
// IdArray<Id, N, T> is the fixed-size form for an enum whose N values are
// known at compile time (tiers, categories). index_of and id_at are the
// only conversions between an id and a position; code outside this header
// does not cast ids. id_literals spell a known id (0_param, 13_module).
//
// An absent id (a parameter a model does not have, a module before the
// first) is a std::optional<Id>, never a negative number.
//
// Thread safety: as std::vector and std::array.
// Errors: at() throws std::out_of_range past the end, as std::vector's does.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ztrain {

enum class ParamId : std::int32_t {};
enum class ModuleId : std::int32_t {};
// A gather group: parameters that are gathered and released together
// (shard/param_gatherer.h).
enum class GroupId : std::int32_t {};
// A reduce bucket: a range of the flat gradients reduced at once
// (shard/reduce_plan.h).
enum class BucketId : std::int32_t {};

template <class T>
concept Identity = std::is_same_v<T, ParamId> || std::is_same_v<T, ModuleId> ||
    std::is_same_v<T, GroupId> || std::is_same_v<T, BucketId>;

template <class Id>
constexpr std::size_t index_of(Id id) noexcept {
  return static_cast<std::size_t>(id);
}
template <class Id>
constexpr Id id_at(std::size_t i) noexcept {
  return static_cast<Id>(i);
}
// An id's number, for messages ("parameter 3").
template <Identity Id>
std::string to_string(Id id) {
  return std::to_string(index_of(id));
}

// The id after `id` (the next module in execution order).
template <class Id>
constexpr Id next_id(Id id) noexcept {
  return id_at<Id>(index_of(id) + 1);
}

// The ids [first, last), for range-for.
template <class Id>
class IdRange {
 public:
  class iterator {
   public:
    constexpr explicit iterator(std::size_t i) : i_(i) {}
    constexpr Id operator*() const { return id_at<Id>(i_); }
    constexpr iterator& operator++() {
      ++i_;
      return *this;
    }
    constexpr bool operator==(const iterator&) const = default;

   private:
    std::size_t i_;
  };
  constexpr IdRange(std::size_t first, std::size_t last) : first_(first), last_(last) {}
  constexpr iterator begin() const { return iterator(first_); }
  constexpr iterator end() const { return iterator(last_); }
  constexpr std::size_t size() const { return last_ - first_; }

 private:
  std::size_t first_, last_;
};

// Ids 0..n-1.
template <class Id>
constexpr IdRange<Id> first_ids(std::size_t n) {
  return IdRange<Id>(0, n);
}

// A std::vector indexed by Id.
template <class Id, class T>
class IdVector {
 public:
  IdVector() = default;
  explicit IdVector(std::size_t n) : items_(n) {}
  IdVector(std::size_t n, const T& value) : items_(n, value) {}
  IdVector(std::initializer_list<T> items) : items_(items) {}

  // std::vector's own reference types, so that IdVector<Id, bool> works.
  using reference = typename std::vector<T>::reference;
  using const_reference = typename std::vector<T>::const_reference;

  reference operator[](Id id) { return items_[index_of(id)]; }
  const_reference operator[](Id id) const { return items_[index_of(id)]; }
  reference at(Id id) { return items_.at(index_of(id)); }
  const_reference at(Id id) const { return items_.at(index_of(id)); }
  bool contains(Id id) const { return index_of(id) < items_.size(); }

  // Appends and returns the new item's id.
  Id push_back(T item) {
    items_.push_back(std::move(item));
    return id_at<Id>(items_.size() - 1);
  }
  template <class... Args>
  reference emplace_back(Args&&... args) {
    return items_.emplace_back(std::forward<Args>(args)...);
  }
  void resize(std::size_t n) { items_.resize(n); }
  void reserve(std::size_t n) { items_.reserve(n); }
  void clear() { items_.clear(); }
  reference front() { return items_.front(); }
  const_reference front() const { return items_.front(); }
  reference back() { return items_.back(); }
  const_reference back() const { return items_.back(); }

  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  IdRange<Id> ids() const { return first_ids<Id>(items_.size()); }
  // The id the next push_back returns.
  Id end_id() const { return id_at<Id>(items_.size()); }

  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  // The items in id order, for code that hands them on as a plain vector.
  const std::vector<T>& items() const { return items_; }
  bool operator==(const IdVector&) const = default;

 private:
  std::vector<T> items_;
};

// Ids written as numbers, where a test or a model names a known one:
// `using namespace ztrain::id_literals; ctx.param(0_param);`.
namespace id_literals {
constexpr ParamId operator""_param(unsigned long long i) {
  return id_at<ParamId>(i);
}
constexpr ModuleId operator""_module(unsigned long long i) {
  return id_at<ModuleId>(i);
}
constexpr GroupId operator""_group(unsigned long long i) {
  return id_at<GroupId>(i);
}
constexpr BucketId operator""_bucket(unsigned long long i) {
  return id_at<BucketId>(i);
}
}  // namespace id_literals

// A T for each of the N values of the enum Id, indexed by the enum itself.
// Iterating gives the values in the enum's order.
template <class Id, std::size_t N, class T>
class IdArray {
 public:
  T& operator[](Id id) { return cells_[index_of(id)]; }
  const T& operator[](Id id) const { return cells_[index_of(id)]; }
  auto begin() { return cells_.begin(); }
  auto end() { return cells_.end(); }
  auto begin() const { return cells_.begin(); }
  auto end() const { return cells_.end(); }
  bool operator==(const IdArray&) const = default;

 private:
  std::array<T, N> cells_{};
};

}  // namespace ztrain
