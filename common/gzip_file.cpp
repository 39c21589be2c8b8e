// gzip files through zlib's gzFile interface; see gzip_file.hpp.
#include "gzip_file.hpp"

#include <zlib.h>

#include <algorithm>

#include "errors.hpp"

namespace stepcast {

namespace {
constexpr size_t kBufferBytes = 1 << 20;
gzFile as_gz(void* file) { return static_cast<gzFile>(file); }
}  // namespace

GzipFileBuf::GzipFileBuf(const std::string& path) : path_(path), buffer_(kBufferBytes) {
  file_ = gzopen(path.c_str(), "wb1");
  if (!file_) throw InputError(path + ": cannot create the gzip file");
  setp(buffer_.data(), buffer_.data() + buffer_.size());
}

GzipFileBuf::~GzipFileBuf() {
  if (file_) gzclose(as_gz(file_));
}

bool GzipFileBuf::drain() {
  const std::ptrdiff_t n = pptr() - pbase();
  if (n > 0 && !failed_ && gzwrite(as_gz(file_), pbase(), unsigned(n)) != int(n)) failed_ = true;
  setp(buffer_.data(), buffer_.data() + buffer_.size());
  return !failed_;
}

int GzipFileBuf::overflow(int c) {
  if (!drain()) return traits_type::eof();
  if (c != traits_type::eof()) {
    *pptr() = char(c);
    pbump(1);
  }
  return traits_type::not_eof(c);
}

int GzipFileBuf::sync() { return drain() ? 0 : -1; }

std::streamsize GzipFileBuf::xsputn(const char* s, std::streamsize n) {
  std::streamsize done = 0;
  while (done < n) {
    if (pptr() == epptr() && !drain()) return done;
    std::streamsize room = std::min<std::streamsize>(epptr() - pptr(), n - done);
    std::copy(s + done, s + done + room, pptr());
    pbump(int(room));
    done += room;
  }
  return done;
}

void GzipFileBuf::close() {
  drain();
  int status = gzclose(as_gz(file_));
  file_ = nullptr;
  if (failed_ || status != Z_OK) throw InputError(path_ + ": writing the gzip file failed");
}

std::string read_gzip_file(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw InputError(path + ": cannot open file");
  gzbuffer(file, unsigned(kBufferBytes));
  std::string text;
  std::vector<char> chunk(kBufferBytes);
  while (true) {
    int n = gzread(file, chunk.data(), unsigned(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string why = gzerror(file, &code);
      gzclose(file);
      throw InputError(path + ": not a readable gzip file (" + why + ")");
    }
    if (n == 0) break;
    text.append(chunk.data(), size_t(n));
  }
  gzclose(file);
  return text;
}

bool has_gzip_suffix(const std::string& path) {
  return path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
}

}  // namespace stepcast
