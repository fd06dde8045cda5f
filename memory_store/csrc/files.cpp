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
// Up to `want` bytes from offset 0; fewer when the file is shorter by now.
std::vector<uint8_t> read_all(int fd, uint64_t want, const std::string& path) {
  std::vector<uint8_t> out(want);
  uint64_t got = 0;
  while (got < want) {
    ssize_t n = ::pread(fd, out.data() + got, want - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(errno, os_error("cannot read", path, errno));
    if (n == 0) break;
    got += static_cast<uint64_t>(n);
  }
  out.resize(got);
  return out;
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
