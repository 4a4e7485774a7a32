// Which pages of baked weights were written since they were last looked at: the kernel's own
// write tracking (userfaultfd's asynchronous write protection, Linux 5.19+, read and re-armed by
// the PAGEMAP_SCAN ioctl, Linux 6.7+), so the per-call weight check of
// torch_fl/bpu/conversion/freezing.py hashes only the weights' bytes on pages that were written,
// not every weight. Linux-only; where the kernel, its configuration or a
// sandbox refuses it, `availability()` says why and the caller hashes everything as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/fingerprint.h"

namespace torch_fl {
namespace write_watch {

// "" where this process can watch writes; else why not (one line, naming what is missing).
std::string unavailable_reason();

enum class Verdict : int {
  kUnchanged = 0,  // no watched byte changed since the watch was armed
  kChanged = 1,    // some watched byte holds other content
  kUnknown = 2,    // the watch no longer sees writes (a forked child, a mapping changed): hash
};

struct PageState;  // one watched page, shared by every watch over it (write_watch.cpp)

// The bytes of a set of ranges: every page they touch in private anonymous memory is watched
// (on `check`, a written page has the ranges' bytes on it hashed again), with short gaps between
// such pages, so that few scans cover them all. A partial page written on kMaxStrikes checks
// (it shares the page with memory written often) is dropped from the watch and its bytes hashed
// on every check, as are the bytes in memory that is not private anonymous memory (file
// mappings, shared memory).
class Watch {
 public:
  // nullptr, with `why`, where nothing could be watched (the caller hashes as before).
  static std::unique_ptr<Watch> arm(const std::vector<std::pair<uintptr_t, size_t>>& ranges,
                                    std::string* why);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  Verdict check();

  size_t watched_bytes() const;  // the ranges' bytes on the pages watched now
  size_t hashed_bytes() const;   // bytes hashed on every check (dropped pages, other mappings)
  size_t runs() const;           // runs of consecutive pages: one scan call each per check

 private:
  Watch() = default;
  struct Run {
    uintptr_t start;
    uintptr_t end;
  };
  struct Piece {
    const unsigned char* data;
    size_t nbytes;
  };
  // strikes_ of a page inside a range (never dropped), and of a page dropped from the watch
  static constexpr uint8_t kWholePage = 0xFE, kDropped = 0xFF, kMaxStrikes = 3;
  bool parts_equal(size_t page) const;  // the ranges' bytes on page `page` hash as when armed
  void drop_page(size_t page);          // hash its bytes on every check, stop scanning it

  size_t page_size_ = 0;
  long pid_ = 0;
  std::vector<Run> runs_;                  // maximal runs of consecutive watched pages
  std::vector<PageState*> pages_;          // in address order, runs_ one after another
  std::vector<uintptr_t> addresses_;       // each page's address
  std::vector<uint64_t> seen_;             // each page's write count when last hashed equal
  uint64_t seen_writes_ = 0;               // all pages' writes when this watch last looked
  std::vector<uint8_t> strikes_;           // checks that found a partial page written equal
  std::vector<Piece> parts_;               // the ranges' bytes on each page, pages in order
  std::vector<size_t> part_end_;           // page i's parts end at parts_[part_end_[i]]
  std::vector<Fingerprint128> part_prints_;
  std::vector<Piece> pieces_;              // hashed on every check
  std::vector<Fingerprint128> piece_prints_;
  mutable std::mutex mutex_;               // one check at a time per watch
};

}  // namespace write_watch
}  // namespace torch_fl
