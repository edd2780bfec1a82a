package resolver

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
)

// fileFormat is the envelope version of a last-known-good file.
const fileFormat = 1

// envelope is a last-known-good file: the view's JSON and the SHA-256 of
// exactly those bytes, so a torn or edited file is detected before any of
// it is trusted.
type envelope struct {
	Format int             `json:"format"`
	SHA256 string          `json:"sha256"`
	View   json.RawMessage `json:"view"`
}

// FileName returns the path of service's last-known-good file in dir.
func FileName(dir, service string) string {
	return filepath.Join(dir, url.PathEscape(service)+".view.json")
}

// LoadView reads service's last-known-good view from dir. A missing file
// returns an error satisfying errors.Is(err, fs.ErrNotExist); a file that
// cannot be trusted in full returns an error wrapping ErrCorruptCache that
// says why. It never returns part of a file.
func LoadView(dir, service string) (View, error) {
	path := FileName(dir, service)
	b, err := os.ReadFile(path)
	if err != nil {
		return View{}, fmt.Errorf("load view %s: %w", path, err)
	}
	corrupt := func(reason string, args ...any) (View, error) {
		return View{}, fmt.Errorf("load view %s: %s: %w", path, fmt.Sprintf(reason, args...), ErrCorruptCache)
	}
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return corrupt("decode envelope: %v", err)
	}
	if env.Format != fileFormat {
		return corrupt("format %d, want %d", env.Format, fileFormat)
	}
	sum := sha256.Sum256(env.View)
	if got := hex.EncodeToString(sum[:]); got != env.SHA256 {
		return corrupt("content sha256 %s, envelope says %s", got, env.SHA256)
	}
	var v View
	if err := json.Unmarshal(env.View, &v); err != nil {
		return corrupt("decode view: %v", err)
	}
	if v.Service != service {
		return corrupt("file holds service %q", v.Service)
	}
	if !slices.IsSortedFunc(v.Endpoints, compareEndpoints) {
		slices.SortFunc(v.Endpoints, compareEndpoints)
	}
	if err := checkUnique(v.Endpoints); err != nil {
		return corrupt("%v", err)
	}
	if got := sumOf(v.Endpoints); !got.matches(v.Checksum) {
		return corrupt("endpoint checksum %s, view says %s", got, v.Checksum)
	}
	return v, nil
}

// writeView replaces v's last-known-good file atomically: a temporary file
// in the same directory, fsync, rename over the old one, fsync the
// directory so the rename itself survives a crash.
func writeView(dir string, v View) (err error) {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode view: %w", err)
	}
	sum := sha256.Sum256(body)
	// Written by hand rather than via json.Marshal(envelope) so the view's
	// bytes on disk are exactly the bytes hashed.
	var buf bytes.Buffer
	buf.Grow(len(body) + 128)
	fmt.Fprintf(&buf, `{"format":%d,"sha256":"%s","view":`, fileFormat, hex.EncodeToString(sum[:]))
	buf.Write(body)
	buf.WriteString("}\n")

	final := FileName(dir, v.Service)
	f, err := os.CreateTemp(dir, "."+filepath.Base(final)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp) // best effort; the error that matters is err
		}
	}()
	if _, err = f.Write(buf.Bytes()); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err = os.Rename(tmp, final); err != nil {
		return fmt.Errorf("rename to %s: %w", final, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
