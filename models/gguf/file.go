package gguf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every error about a malformed file: a bad magic, a truncated
// header, a count or length the file cannot hold, a tensor outside the data section.
var ErrInvalid = errors.New("invalid GGUF file")

// ErrUnsupported is wrapped by errors about a well-formed file, or tensor, that this package
// does not read: GGUF version 1, a big-endian file, a tensor type it cannot decode.
var ErrUnsupported = errors.New("unsupported GGUF content")

// formatError is an ErrInvalid or ErrUnsupported error: one line, "gguf: " and the message.
type formatError struct {
	msg  string
	kind error
}

func (e *formatError) Error() string { return "gguf: " + e.msg }
func (e *formatError) Unwrap() error { return e.kind }

// invalidf returns an ErrInvalid error with a formatted message.
func invalidf(format string, args ...any) error {
	return &formatError{msg: fmt.Sprintf(format, args...), kind: ErrInvalid}
}

// unsupportedf returns an ErrUnsupported error with a formatted message.
func unsupportedf(format string, args ...any) error {
	return &formatError{msg: fmt.Sprintf(format, args...), kind: ErrUnsupported}
}

// File is an open GGUF file: its header, metadata and tensor infos, read and checked by Open
// or NewFile, and the reader its tensor data is read from on demand. A File is safe for
// concurrent use once opened.
type File struct {
	// Version is the GGUF version, 2 or 3.
	Version uint32
	// Metadata holds the key/value pairs.
	Metadata Metadata
	// Alignment is the alignment in bytes of the data section and of every tensor in it.
	Alignment int64
	// DataOffset is the file offset of the data section; TensorInfo.Offset counts from it.
	DataOffset int64

	tensors []TensorInfo
	byName  map[string]int
	r       io.ReaderAt
	closer  io.Closer
}

// Open opens the GGUF file at path and reads its header, metadata and tensor infos; tensor
// data stays on disk until ReadRaw or ReadFloat32 asks for it. The file stays open until
// Close.
func Open(path string) (*File, error) {
	osf, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	st, err := osf.Stat()
	if err != nil {
		osf.Close()
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := NewFile(osf, st.Size())
	if err != nil {
		osf.Close()
		var fe *formatError
		if errors.As(err, &fe) {
			return nil, &formatError{msg: path + ": " + fe.msg, kind: fe.kind}
		}
		return nil, err
	}
	f.closer = osf
	return f, nil
}

// NewFile reads a GGUF file of size bytes from r, as Open does. Close does not close r.
func NewFile(r io.ReaderAt, size int64) (*File, error) {
	if size < 0 {
		return nil, invalidf("negative file size %d", size)
	}
	p := &parser{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 64<<10), size: size}
	f, err := p.file()
	if err != nil {
		return nil, err
	}
	f.r = r
	return f, nil
}

// Close closes the file opened by Open; it does nothing for a File made by NewFile.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}

// maxShownBytes bounds how much of a key or tensor name an error message shows.
const maxShownBytes = 120

// showName returns a tensor name for an error message: as it is when it is plain printable
// text without spaces, quoted with Go escapes otherwise, and cut to maxShownBytes either
// way, so that an error stays one readable line whatever bytes the file holds.
func showName(s string) string {
	cut := shorten(s)
	q := strconv.Quote(cut)
	if cut != "" && q[1:len(q)-1] == cut && !strings.Contains(cut, " ") {
		return cut
	}
	return q
}

// quoteKey returns a metadata key for an error message: quoted with Go escapes and cut to
// maxShownBytes.
func quoteKey(s string) string {
	return strconv.Quote(shorten(s))
}

// shorten cuts s to maxShownBytes, marking the cut with "...".
func shorten(s string) string {
	if len(s) <= maxShownBytes {
		return s
	}
	return s[:maxShownBytes] + "..."
}
