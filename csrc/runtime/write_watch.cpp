#include "runtime/write_watch.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#if defined(__linux__)
#include <fcntl.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace torch_fl {
namespace write_watch {

#if defined(__linux__) && defined(SYS_userfaultfd)
namespace {

// The kernel's ABI (include/uapi/linux/userfaultfd.h, fs.h), spelled out: the boards' and older
// hosts' headers predate it, and the probe at run time decides whether the kernel has it.
constexpr uint64_t kUffdApi = 0xAA;
constexpr uint64_t kFeatureWpAsync = 1ULL << 15;
constexpr int kUserModeOnly = 1;  // UFFD_USER_MODE_ONLY: allowed without privilege
constexpr uint64_t kRegisterModeWp = 1ULL << 1;
struct UffdioApi {
  uint64_t api, features, ioctls;
};
struct UffdioRange {
  uint64_t start, len;
};
struct UffdioRegister {
  UffdioRange range;
  uint64_t mode, ioctls;
};
constexpr unsigned long kUffdioApi = _IOWR(0xAA, 0x3F, UffdioApi);
constexpr unsigned long kUffdioRegister = _IOWR(0xAA, 0x00, UffdioRegister);

struct PageRegion {
  uint64_t start, end, categories;
};
struct PmScanArg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted,
      category_mask, category_anyof_mask, return_mask;
};
constexpr uint64_t kScanWpMatching = 1 << 0;
constexpr uint64_t kScanCheckWpAsync = 1 << 1;
constexpr uint64_t kPageIsWritten = 1 << 1;
constexpr uint64_t kPageIsPresent = 1 << 3;
constexpr unsigned long kPagemapScan = _IOWR('f', 16, PmScanArg);

// The process's one userfaultfd and pagemap descriptor, opened on first use and again in a
// forked child (whose registrations the kernel dropped, and whose inherited /proc/self/pagemap
// descriptor still reads its parent).
struct Process {
  long pid = -1;
  int uffd = -1;
  int pagemap = -1;
  std::string reason;
};

constexpr size_t kMaxRuns = 4096;
// Gaps of at most this many pages between touched pages are watched too, so that one scan covers
// both sides: a bridge page holds none of the weights' bytes, and a write to it is only counted.
constexpr uintptr_t kMaxBridgePages = 4;
// A run of pages holding fewer of the weights' bytes than this is hashed on every check instead:
// a scan call costs about 0.9 us (46 runs of MobileNetV3's pages: 49 us a check; one run: 8 us),
// and the fingerprint hashes 16 KB in 0.25 to 0.85 us (19 to 65 GB/s: fingerprint.cpp). Most
// of MobileNetV3's small weights (BN scales and biases, 84 runs of pages) are hashed so.
constexpr size_t kMinWatchedBytes = 16 * 1024;
std::mutex g_mutex;  // guards g_process, g_pages and every scan
Process g_process;

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Opens both descriptors for this process (under g_mutex); false, with the reason, where the
// kernel or a sandbox refuses: userfaultfd needs Linux 5.19 for asynchronous write protection,
// PAGEMAP_SCAN Linux 6.7; Docker's default seccomp profile blocks userfaultfd.
bool ensure_process() {
  // a fork while another thread scans would leave the child's g_mutex locked for good: hold it
  // across fork, so both sides start with it free
  static const int fork_safe = ::pthread_atfork([] { g_mutex.lock(); }, [] { g_mutex.unlock(); },
                                                [] { g_mutex.unlock(); });
  (void)fork_safe;
  const long pid = static_cast<long>(::getpid());
  if (g_process.pid == pid) return g_process.reason.empty();
  if (g_process.pid != -1) {  // a forked child: the inherited descriptors are its parent's
    if (g_process.uffd >= 0) ::close(g_process.uffd);
    if (g_process.pagemap >= 0) ::close(g_process.pagemap);
  }
  g_process = Process{};
  g_process.pid = pid;
  int uffd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | kUserModeOnly));
  if (uffd < 0 && errno == EINVAL) {  // a kernel before 5.11 knows no user-mode-only flag
    uffd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  }
  if (uffd < 0) {
    g_process.reason = errno_text("userfaultfd() refused (kernel, vm.unprivileged_userfaultfd "
                                  "or a seccomp profile)");
    return false;
  }
  UffdioApi api{kUffdApi, kFeatureWpAsync, 0};
  if (::ioctl(uffd, kUffdioApi, &api) != 0) {
    g_process.reason = errno_text("userfaultfd has no asynchronous write protection "
                                  "(UFFD_FEATURE_WP_ASYNC: Linux 5.19+)");
    ::close(uffd);
    return false;
  }
  const int pagemap = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pagemap < 0) {
    g_process.reason = errno_text("cannot open /proc/self/pagemap");
    ::close(uffd);
    return false;
  }
  // PAGEMAP_SCAN on an empty range: EINVAL or ENOTTY where the kernel predates it (6.7)
  PmScanArg probe{};
  probe.size = sizeof probe;
  probe.return_mask = kPageIsWritten;
  if (::ioctl(pagemap, kPagemapScan, &probe) < 0) {
    g_process.reason = errno_text("no PAGEMAP_SCAN ioctl (Linux 6.7+)");
    ::close(uffd);
    ::close(pagemap);
    return false;
  }
  g_process.uffd = uffd;
  g_process.pagemap = pagemap;
  return true;
}

// Private anonymous read-write mappings, from /proc/self/maps: the memory whose every write this
// process's page tables see. Shared memory (another process writes it through its own page
// tables) and file mappings (a private page still reads the file until first written) are not.
std::vector<std::pair<uintptr_t, uintptr_t>> private_anonymous() {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string span, perms, offset, dev, path;
    unsigned long long inode = 0;
    in >> span >> perms >> offset >> dev >> inode;
    std::getline(in >> std::ws, path);
    const bool anonymous =
        inode == 0 && (path.empty() || path == "[heap]" || path.rfind("[anon", 0) == 0);
    if (!anonymous || perms.size() < 4 || perms[0] != 'r' || perms[1] != 'w' || perms[3] != 'p')
      continue;
    const size_t dash = span.find('-');
    if (dash == std::string::npos) continue;
    out.emplace_back(std::stoull(span.substr(0, dash), nullptr, 16),
                     std::stoull(span.substr(dash + 1), nullptr, 16));
  }
  return out;
}

}  // namespace

struct PageState {
  uint64_t writes = 0;  // how many scans found this page written (or gone) since it was watched
  int refs = 0;         // watches over it
};

namespace {
std::map<uintptr_t, std::unique_ptr<PageState>> g_pages;  // watched pages by address
uint64_t g_writes = 0;  // writes counted on any watched page: unchanged, no watch need look

// Scans [start, end) for pages written (or no longer present) since the last scan, counting each
// in its PageState, and write-protects them again in the same call: a write racing the scan is
// either counted now or faults and is counted by the next one. False where the range is no
// longer under asynchronous write protection (a mapping replaced). Under g_mutex.
bool scan(uintptr_t start, uintptr_t end, size_t page_size) {
  PageRegion found[32];
  PmScanArg arg{};
  arg.size = sizeof arg;
  arg.flags = kScanWpMatching | kScanCheckWpAsync;
  arg.start = start;
  arg.end = end;
  arg.vec = reinterpret_cast<uint64_t>(found);
  arg.vec_len = 32;
  // written, or not present (a page discarded under the watch reads other bytes when it
  // returns): the categories' "not present" is the present bit inverted
  arg.category_inverted = kPageIsPresent;
  arg.category_anyof_mask = kPageIsWritten | kPageIsPresent;
  arg.return_mask = kPageIsWritten | kPageIsPresent;
  for (;;) {
    const long n = ::ioctl(g_process.pagemap, kPagemapScan, &arg);
    if (n < 0) return false;
    for (long i = 0; i < n; ++i) {
      for (uintptr_t page = found[i].start; page < found[i].end; page += page_size) {
        auto it = g_pages.find(page);
        if (it != g_pages.end()) {
          ++it->second->writes;
          ++g_writes;
        }
      }
    }
    if (arg.walk_end >= end || n < static_cast<long>(arg.vec_len)) return true;
    arg.start = arg.walk_end;
  }
}
}  // namespace

std::string unavailable_reason() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return ensure_process() ? std::string() : g_process.reason;
}

namespace {

// The pages a set of ranges touches, in address order, and the ranges' bytes on each ([lo, hi)
// intervals, merged; the whole page for a page inside a range; none for a bridge page). Flat:
// a gigabyte of weights is a quarter of a million pages.
struct TouchedPages {
  std::vector<uintptr_t> page;
  std::vector<size_t> end;  // page i's parts are parts[end[i - 1]] up to parts[end[i]]
  std::vector<std::pair<uintptr_t, uintptr_t>> parts;

  size_t size() const { return page.size(); }
  size_t begin_of(size_t i) const { return i ? end[i - 1] : 0; }
  size_t bytes(size_t i) const {
    size_t n = 0;
    for (size_t k = begin_of(i); k < end[i]; ++k) n += parts[k].second - parts[k].first;
    return n;
  }
  void add_page(uintptr_t at) {
    page.push_back(at);
    end.push_back(parts.size());
  }
};

// The pages `ranges` touch, with gaps of at most kMaxBridgePages pages between them bridged.
TouchedPages touched_pages(const std::vector<std::pair<uintptr_t, size_t>>& ranges,
                           uintptr_t psz) {
  struct Part {
    uintptr_t page, lo, hi;
  };
  std::vector<Part> parts;
  for (const auto& [ptr, n] : ranges) {
    if (n == 0) continue;
    for (uintptr_t page = ptr / psz * psz; page < ptr + n; page += psz) {
      parts.push_back({page, std::max(page, ptr), std::min(page + psz, ptr + n)});
    }
  }
  std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) {
    return a.page != b.page ? a.page < b.page : a.lo < b.lo;
  });
  TouchedPages out;
  for (const Part& part : parts) {
    if (out.size() && out.page.back() != part.page) {
      const uintptr_t next = out.page.back() + psz;
      if (part.page > next && part.page - next <= kMaxBridgePages * psz) {
        for (uintptr_t page = next; page < part.page; page += psz) out.add_page(page);
      }
    }
    if (!out.size() || out.page.back() != part.page) out.add_page(part.page);
    if (out.end.back() > out.begin_of(out.size() - 1) && part.lo <= out.parts.back().second) {
      out.parts.back().second = std::max(out.parts.back().second, part.hi);  // overlapping views
    } else {
      out.parts.emplace_back(part.lo, part.hi);
      ++out.end.back();
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Watch> Watch::arm(const std::vector<std::pair<uintptr_t, size_t>>& ranges,
                                  std::string* why) {
  std::unique_ptr<Watch> w(new Watch());
  const long ps = ::sysconf(_SC_PAGESIZE);  // 4 KB here, 64 KB on the boards' kernels
  w->page_size_ = static_cast<size_t>(ps > 0 ? ps : 4096);
  const uintptr_t psz = w->page_size_;
  auto hash_instead = [&](const TouchedPages& pages, size_t i) {
    for (size_t k = pages.begin_of(i); k < pages.end[i]; ++k) {
      const auto& [lo, hi] = pages.parts[k];
      w->pieces_.push_back({reinterpret_cast<const unsigned char*>(lo), hi - lo});
    }
  };
  // Every page a range touches is watched, its partial pages too (a written one has only the
  // range's bytes on it hashed), and so are short gaps between them: weights lie between other
  // heap chunks, and one scan per run of pages is most of a check's cost (MobileNetV3's 210
  // weights: 46 runs with whole pages only, 49 us a check; one run of the same pages: 8 us).
  const TouchedPages all = touched_pages(ranges, psz);
  std::vector<size_t> keep;  // the pages of runs worth a scan, as indices into `all`
  size_t run_count = 0;
  for (size_t i = 0; i < all.size();) {
    size_t j = i + 1, bytes = all.bytes(i);
    for (; j < all.size() && all.page[j] == all.page[j - 1] + psz; ++j) bytes += all.bytes(j);
    for (size_t k = i; k < j; ++k) {
      if (bytes >= kMinWatchedBytes) {
        keep.push_back(k);
      } else {
        hash_instead(all, k);
      }
    }
    run_count += bytes >= kMinWatchedBytes;
    i = j;
  }
  if (run_count > kMaxRuns) {
    // each run's registration may split a mapping in two: thousands of them would spend the
    // process's mappings (vm.max_map_count, 65530 by default) and a scan call each
    *why = "the weights' pages lie in " + std::to_string(run_count) + " separate runs (more "
           "than " + std::to_string(kMaxRuns) + ")";
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!ensure_process()) {
    *why = g_process.reason;
    return nullptr;
  }
  w->pid_ = g_process.pid;
  // the pages in private anonymous memory are watched, the bytes on the others hashed
  const auto usable = private_anonymous();
  std::vector<size_t> watched;
  size_t u = 0;
  for (size_t i = 0; i < keep.size();) {
    // the next stretch of consecutive pages inside one usable mapping
    const uintptr_t a = all.page[keep[i]];
    while (u < usable.size() && usable[u].second <= a) ++u;
    if (u == usable.size() || usable[u].first > a) {
      hash_instead(all, keep[i++]);
      continue;
    }
    size_t j = i + 1;
    while (j < keep.size() && all.page[keep[j]] == all.page[keep[j - 1]] + psz &&
           all.page[keep[j]] < usable[u].second) {
      ++j;
    }
    const uintptr_t b = all.page[keep[j - 1]] + psz;
    UffdioRegister reg{{a, b - a}, kRegisterModeWp, 0};
    if (::ioctl(g_process.uffd, kUffdioRegister, &reg) == 0) {
      if (!w->runs_.empty() && w->runs_.back().end == a) {
        w->runs_.back().end = b;
      } else {
        w->runs_.push_back({a, b});
      }
      for (size_t k = i; k < j; ++k) watched.push_back(keep[k]);
    } else {
      for (size_t k = i; k < j; ++k) hash_instead(all, keep[k]);  // EBUSY: another userfaultfd
    }
    i = j;
  }
  size_t watched_bytes = 0;
  for (const size_t i : watched) watched_bytes += all.bytes(i);
  if (watched_bytes == 0) {
    *why = "no page of these weights lies in private anonymous memory this process can watch";
    return nullptr;
  }
  w->pages_.reserve(watched.size());
  for (const size_t i : watched) {
    std::unique_ptr<PageState>& state = g_pages[all.page[i]];
    if (!state) state.reset(new PageState());
    ++state->refs;
    w->pages_.push_back(state.get());
    w->addresses_.push_back(all.page[i]);
    w->strikes_.push_back(all.bytes(i) == psz ? kWholePage : 0);
    for (size_t k = all.begin_of(i); k < all.end[i]; ++k) {
      const auto& [lo, hi] = all.parts[k];
      w->parts_.push_back({reinterpret_cast<const unsigned char*>(lo), hi - lo});
    }
    w->part_end_.push_back(w->parts_.size());
  }
  for (const Run& run : w->runs_) {
    if (!scan(run.start, run.end, psz)) {  // protects every page: from here on writes count
      *why = errno_text("PAGEMAP_SCAN refused the weights' pages");
      return nullptr;  // `lock` goes first, then the destructor releases the pages
    }
  }
  w->seen_.reserve(w->pages_.size());
  for (const PageState* p : w->pages_) w->seen_.push_back(p->writes);
  w->seen_writes_ = g_writes;
  // the prints after the protection: a write after it is counted by the next scan, one before
  // it is in these bytes (the caller compares the weights with the baked ones once more)
  w->part_prints_.reserve(w->parts_.size());
  for (const Piece& part : w->parts_) {
    w->part_prints_.push_back(fingerprint_bytes(part.data, part.nbytes));
  }
  w->piece_prints_.resize(w->pieces_.size());
  for (size_t i = 0; i < w->pieces_.size(); ++i) {
    w->piece_prints_[i] = fingerprint_bytes(w->pieces_[i].data, w->pieces_[i].nbytes);
  }
  return w;
}

Watch::~Watch() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t i = 0; i < pages_.size(); ++i) {
    // the registration stays: memory freed under it takes at most one write fault, once
    if (--pages_[i]->refs == 0) g_pages.erase(addresses_[i]);
  }
}

size_t Watch::watched_bytes() const {
  std::lock_guard<std::mutex> own(mutex_);
  size_t n = 0;
  for (size_t i = 0; i < pages_.size(); ++i) {
    if (strikes_[i] == kDropped) continue;
    for (size_t k = i ? part_end_[i - 1] : 0; k < part_end_[i]; ++k) n += parts_[k].nbytes;
  }
  return n;
}

size_t Watch::hashed_bytes() const {
  std::lock_guard<std::mutex> own(mutex_);
  size_t n = 0;
  for (const Piece& p : pieces_) n += p.nbytes;
  return n;
}

size_t Watch::runs() const {
  std::lock_guard<std::mutex> own(mutex_);
  return runs_.size();
}

bool Watch::parts_equal(size_t page) const {
  for (size_t k = page ? part_end_[page - 1] : 0; k < part_end_[page]; ++k) {
    const Fingerprint128 now = fingerprint_bytes(parts_[k].data, parts_[k].nbytes);
    if (now.lo != part_prints_[k].lo || now.hi != part_prints_[k].hi) return false;
  }
  return true;
}

void Watch::drop_page(size_t page) {
  // its bytes join those hashed on every check (just found equal to their prints)
  for (size_t k = page ? part_end_[page - 1] : 0; k < part_end_[page]; ++k) {
    pieces_.push_back(parts_[k]);
    piece_prints_.push_back(part_prints_[k]);
  }
  strikes_[page] = kDropped;
  // the runs again, without it: no scan re-protects it, so its writer takes one fault at most
  std::vector<Run> runs;
  for (size_t i = 0; i < pages_.size(); ++i) {
    if (strikes_[i] == kDropped) continue;
    if (!runs.empty() && runs.back().end == addresses_[i]) {
      runs.back().end += page_size_;
    } else {
      runs.push_back({addresses_[i], addresses_[i] + page_size_});
    }
  }
  runs_ = std::move(runs);
}

Verdict Watch::check() {
  // a forked child: the kernel dropped its registrations (and this watch's own mutex may have
  // been held by a parent thread at the fork)
  if (static_cast<long>(::getpid()) != pid_) return Verdict::kUnknown;
  std::lock_guard<std::mutex> own(mutex_);
  std::vector<size_t> written;
  std::vector<uint64_t> counts;
  uint64_t writes_now = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_process.pid != pid_) return Verdict::kUnknown;
    for (const Run& run : runs_) {
      if (!scan(run.start, run.end, page_size_)) return Verdict::kUnknown;
    }
    // another watch's scan may have counted a write to a page this one shares; where no
    // scan counted any write since this watch last looked, none of its pages can have one
    if (g_writes != seen_writes_) {
      for (size_t i = 0; i < pages_.size(); ++i) {
        if (pages_[i]->writes != seen_[i]) {
          written.push_back(i);
          counts.push_back(pages_[i]->writes);
        }
      }
    }
    writes_now = g_writes;
  }
  for (size_t j = 0; j < written.size(); ++j) {
    const size_t i = written[j];
    if (strikes_[i] != kDropped) {  // a dropped page's bytes are among the pieces below
      // changed: its count stays unseen, so the next check hashes it again
      if (!parts_equal(i)) return Verdict::kChanged;
      // written with the same bytes, or only other bytes of a page it shares with other
      // memory: a page written on kMaxStrikes checks (a hot neighbour) is hashed from then on
      if (strikes_[i] != kWholePage && ++strikes_[i] >= kMaxStrikes) drop_page(i);
    }
    seen_[i] = counts[j];
  }
  seen_writes_ = writes_now;  // every page counted up to then was hashed equal
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Fingerprint128 now = fingerprint_bytes(pieces_[i].data, pieces_[i].nbytes);
    if (now.lo != piece_prints_[i].lo || now.hi != piece_prints_[i].hi) return Verdict::kChanged;
  }
  return Verdict::kUnchanged;
}

#else  // not Linux: no write tracking; the caller hashes every weight

struct PageState {};

std::string unavailable_reason() { return "write tracking needs Linux (userfaultfd)"; }

std::unique_ptr<Watch> Watch::arm(const std::vector<std::pair<uintptr_t, size_t>>&,
                                  std::string* why) {
  *why = unavailable_reason();
  return nullptr;
}

Watch::~Watch() = default;

size_t Watch::hashed_bytes() const { return 0; }

Verdict Watch::check() { return Verdict::kUnknown; }

#endif

}  // namespace write_watch
}  // namespace torch_fl
