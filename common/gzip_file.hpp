// Files compressed with gzip (zlib): an output stream that writes one, and reading one whole. For
// the large outputs a person asks compressed (`simulate --gzip`: prediction.json.gz and
// trace.json.gz, which Perfetto opens as they are) and for reading them back (`compare`). No
// JSON here; errors are InputError naming the file.
#pragma once

#include <ostream>
#include <streambuf>
#include <string>
#include <vector>

namespace stepcast {

// A std::streambuf writing a gzip file at zlib's level 1 (these are records and traces of
// 10^8 bytes, written once: the fastest level is within about 15% of the smallest).
class GzipFileBuf : public std::streambuf {
 public:
  explicit GzipFileBuf(const std::string& path);  // InputError if it cannot be created
  ~GzipFileBuf() override;
  GzipFileBuf(const GzipFileBuf&) = delete;
  GzipFileBuf& operator=(const GzipFileBuf&) = delete;
  // Flushes and closes; InputError if any write failed.
  void close();

 protected:
  int overflow(int c) override;
  int sync() override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;

 private:
  bool drain();  // writes the buffered bytes; false on a zlib error
  std::string path_;
  void* file_ = nullptr;  // gzFile
  std::vector<char> buffer_;
  bool failed_ = false;
};

// The decompressed contents of the gzip file `path`; InputError if it cannot be read or is not
// gzip.
std::string read_gzip_file(const std::string& path);

// True where `path` names a gzip file by its suffix (".gz").
bool has_gzip_suffix(const std::string& path);

}  // namespace stepcast
