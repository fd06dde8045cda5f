// Reading and opening the bank's files: regular files only, never through a symlink, never waiting on a
// FIFO; every OS error carries the path and errno.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core.h"

namespace memr1 {

std::string os_error(const std::string& what, const std::string& path, int err) {
  return what + " " + path + ": " + std::strerror(err);
}
// Never through a symlink (a write would land outside the bank); O_NONBLOCK so that a FIFO is refused,
// not waited on. O_NONBLOCK changes nothing for the regular files that pass the check.
int open_file(const std::string& path, int flags, const char* what) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) throw LogFormat(std::string(what) + " " + path + " is missing");
  if (fd < 0 && (errno == EISDIR || errno == ELOOP || errno == ENXIO))
    throw LogFormat(std::string(what) + " " + path + " is not a regular file");
  if (fd < 0) throw IoError(errno, os_error(std::string("cannot open ") + what, path, errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw LogFormat(std::string(what) + " " + path + " is not a regular file");
  }
  return fd;
}
// Up to `n` bytes at `off` into `out`; fewer when the file ends first.
uint64_t read_at(int fd, uint8_t* out, uint64_t n, uint64_t off, const std::string& path) {
  uint64_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, out + got, n - got, static_cast<off_t>(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(errno, os_error("cannot read", path, errno));
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return got;
}
std::pair<uint64_t, uint32_t> file_crc32c(const std::string& path) {
  int fd = open_file(path, O_RDONLY, "segment file");
  uint64_t size = 0;
  uint32_t crc = 0;
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(size));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { int e = errno; ::close(fd); throw IoError(e, os_error("cannot read", path, e)); }
    if (n == 0) break;
    crc = crc32c(crc, buf.data(), static_cast<size_t>(n));
    size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return {size, crc};
}

}  // namespace memr1
