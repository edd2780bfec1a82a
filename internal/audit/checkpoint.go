package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Checkpoint is a signed statement that the chain's row Seq hashed Head at
// At, chained to the checkpoint before it (doc.go: Checkpoints).
type Checkpoint struct {
	// N numbers the checkpoints 1, 2, 3...: a missing one shows as a gap.
	N    int64
	Seq  int64
	Head []byte
	At   time.Time
	// Prev is the hash of the previous checkpoint's payload (nil for the
	// first).
	Prev []byte
	// KeyID names the key that signed it (KeyID of its public key).
	KeyID string

	// payload is the exact signed bytes, kept from Decode so the hash of
	// a checkpoint never depends on re-encoding it.
	payload []byte
}

// payload is the signed form of a checkpoint.
type checkpointPayload struct {
	V     int    `json:"v"`
	N     int64  `json:"n"`
	Seq   int64  `json:"seq"`
	Head  string `json:"head"`
	At    string `json:"at"`
	Prev  string `json:"prev"`
	KeyID string `json:"key_id"`
}

type checkpointFile struct {
	Payload   json.RawMessage `json:"payload"`
	Signature string          `json:"signature"`
}

// signingContext prefixes every signed payload, so a checkpoint signature
// can never be passed off as a signature over anything else.
const signingContext = "muster audit checkpoint v1\x00"

// Name is the checkpoint's object name in a sink: the zero-padded N, so
// that names sort in checkpoint order.
func (c Checkpoint) Name() string { return CheckpointName(c.N) }

// CheckpointName is the object name of checkpoint n.
func CheckpointName(n int64) string { return fmt.Sprintf("%016d.json", n) }

// Hash is the SHA-256 of the checkpoint's signed payload: what the next
// checkpoint's Prev names.
func (c Checkpoint) Hash() []byte {
	d := sha256.Sum256(c.payload)
	return d[:]
}

// Sign encodes c with its signature, ready for a sink.
func Sign(ctx context.Context, s Signer, c Checkpoint) (Checkpoint, []byte, error) {
	c.KeyID = s.KeyID()
	p, err := json.Marshal(checkpointPayload{
		V: 1, N: c.N, Seq: c.Seq, Head: hex.EncodeToString(c.Head), At: c.At.UTC().Format(time.RFC3339Nano),
		Prev: hex.EncodeToString(c.Prev), KeyID: c.KeyID,
	})
	if err != nil {
		return c, nil, fmt.Errorf("encode checkpoint %d: %w", c.N, err)
	}
	sig, err := s.Sign(ctx, append([]byte(signingContext), p...))
	if err != nil {
		return c, nil, fmt.Errorf("sign checkpoint %d: %w", c.N, err)
	}
	c.payload = p
	out, err := json.Marshal(checkpointFile{Payload: p, Signature: base64.StdEncoding.EncodeToString(sig)})
	if err != nil {
		return c, nil, fmt.Errorf("encode checkpoint %d: %w", c.N, err)
	}
	return c, append(out, '\n'), nil
}

// DecodeCheckpoint parses a checkpoint file and checks its signature
// against keys (by key ID). It is the decoder of outside input: whatever
// the file holds, it returns a checkpoint whose signature verified, or an
// error.
func DecodeCheckpoint(data []byte, keys Keys) (Checkpoint, error) {
	var f checkpointFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Checkpoint{}, fmt.Errorf("decode checkpoint: %w", err)
	}
	if dec.More() {
		return Checkpoint{}, errors.New("decode checkpoint: trailing data")
	}
	var p checkpointPayload
	pd := json.NewDecoder(bytes.NewReader(f.Payload))
	pd.DisallowUnknownFields()
	if err := pd.Decode(&p); err != nil {
		return Checkpoint{}, fmt.Errorf("decode checkpoint payload: %w", err)
	}
	if p.V != 1 {
		return Checkpoint{}, fmt.Errorf("checkpoint version %d: want 1", p.V)
	}
	pub, ok := keys[p.KeyID]
	if !ok {
		return Checkpoint{}, fmt.Errorf("checkpoint %d is signed by key %q, which is not a trusted audit key", p.N, p.KeyID)
	}
	sig, err := base64.StdEncoding.DecodeString(f.Signature)
	if err != nil || !ed25519.Verify(pub, append([]byte(signingContext), f.Payload...), sig) {
		return Checkpoint{}, fmt.Errorf("checkpoint %d: signature does not verify with key %s", p.N, p.KeyID)
	}
	c := Checkpoint{N: p.N, Seq: p.Seq, KeyID: p.KeyID, payload: slices.Clone([]byte(f.Payload))}
	if c.N < 1 || c.Seq < 0 {
		return Checkpoint{}, fmt.Errorf("checkpoint %d: bad number or seq %d", c.N, c.Seq)
	}
	if c.Head, err = hex.DecodeString(p.Head); err != nil || len(c.Head) != 32 && !(c.Seq == 0 && len(c.Head) == 0) {
		return Checkpoint{}, fmt.Errorf("checkpoint %d: head %q is not a SHA-256 in hex", c.N, p.Head)
	}
	if c.Prev, err = hex.DecodeString(p.Prev); err != nil || (len(c.Prev) != 32 && len(c.Prev) != 0) {
		return Checkpoint{}, fmt.Errorf("checkpoint %d: prev %q is not a SHA-256 in hex", c.N, p.Prev)
	}
	if len(c.Prev) == 0 {
		c.Prev = nil
	}
	if c.At, err = time.Parse(time.RFC3339Nano, p.At); err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint %d: time: %w", c.N, err)
	}
	return c, nil
}

// Signer signs checkpoints with a key the database never holds: a key
// file (KeyFileSigner), or a KMS behind the same three methods.
type Signer interface {
	KeyID() string
	Public() ed25519.PublicKey
	Sign(ctx context.Context, msg []byte) ([]byte, error)
}

// Keys are the public keys checkpoints are trusted from, by key ID.
type Keys map[string]ed25519.PublicKey

// KeyID names a public key: the first 8 bytes of its SHA-256, in hex.
func KeyID(pub ed25519.PublicKey) string {
	d := sha256.Sum256(pub)
	return hex.EncodeToString(d[:8])
}

// KeyFileSigner signs with an Ed25519 private key read from a PEM file.
type KeyFileSigner struct {
	key ed25519.PrivateKey
	id  string
}

// KeyID implements Signer.
func (s *KeyFileSigner) KeyID() string { return s.id }

// Public implements Signer.
func (s *KeyFileSigner) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Sign implements Signer.
func (s *KeyFileSigner) Sign(_ context.Context, msg []byte) ([]byte, error) {
	return ed25519.Sign(s.key, msg), nil
}

// NewKeySigner signs with key, held in memory (tests; a process that got
// its key another way).
func NewKeySigner(key ed25519.PrivateKey) *KeyFileSigner {
	return &KeyFileSigner{key: key, id: KeyID(key.Public().(ed25519.PublicKey))}
}

// LoadKeyFile reads an Ed25519 private key (PKCS #8 PEM). It refuses a
// file that its group or others may read or write: a signing key anyone
// else on the host can read anchors nothing.
func LoadKeyFile(path string) (*KeyFileSigner, error) {
	return LoadKeyFileWith(path, KeyFilePolicy{})
}

// KeyFilePolicy widens the key files LoadKeyFileWith accepts.
type KeyFilePolicy struct {
	// AllowShared accepts a key file its group or others may read (but
	// not write) when it lies on a read-only mount: how a CSI secret
	// store (the Secrets Store CSI driver, Vault's and AWS's providers)
	// presents a secret, mode 0644 on a read-only volume, which only the
	// pod's own containers see. Both are needed: the setting is the
	// operator saying the files' readers are the process's own (a
	// container), and the read-only mount is what a secret store gives
	// and a world-readable file in a home directory or /tmp is not.
	// MUSTER_SECRET_FILES_ALLOW_SHARED.
	AllowShared bool
}

// LoadKeyFileWith is LoadKeyFile under policy p.
func LoadKeyFileWith(path string, p KeyFilePolicy) (*KeyFileSigner, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("audit signing key: %w", err)
	}
	if err := keyFileMode(path, st, p, readOnlyMount); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit signing key: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("audit signing key %s: not a PEM PRIVATE KEY", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("audit signing key %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("audit signing key %s: %T is not an Ed25519 key", path, k)
	}
	return NewKeySigner(priv), nil
}

// LoadOrCreateKeyFile loads the key at path, or (for muster dev) makes a
// new one there with mode 0600, and a copy of its public key beside it
// (path + ".pub") for verifiers. Two processes starting on one data folder
// end up with the same key: the new key is linked into place, which fails
// for the second, which then loads the first's.
func LoadOrCreateKeyFile(path string) (*KeyFileSigner, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if err := createKeyFile(path); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("audit signing key: %w", err)
	}
	s, err := LoadKeyFile(path)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path + ".pub"); errors.Is(err, fs.ErrNotExist) {
		pder, err := x509.MarshalPKIXPublicKey(s.Public())
		if err != nil {
			return nil, fmt.Errorf("encode audit public key: %w", err)
		}
		if err := writeLinked(path+".pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pder}), 0o644); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("write audit public key: %w", err)
		}
	}
	return s, nil
}

func createKeyFile(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("generate audit signing key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("encode audit signing key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("audit signing key: %w", err)
	}
	err = writeLinked(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("write audit signing key: %w", err)
	}
	return nil
}

// writeLinked writes data to a new file at path, whole or not at all: a
// temporary file beside it, synced, then hard-linked into place (which
// fails with fs.ErrExist if path exists).
func writeLinked(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err = errors.Join(err, tmp.Chmod(mode), tmp.Sync(), tmp.Close()); err != nil {
		return err
	}
	return os.Link(tmp.Name(), path)
}

// LoadPublicKeys reads the keys a verifier trusts from PEM files, each a
// PUBLIC KEY or (for convenience on the signing host) the PRIVATE KEY
// itself.
func LoadPublicKeys(paths ...string) (Keys, error) {
	keys := Keys{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("audit public key: %w", err)
		}
		for rest := b; ; {
			var blk *pem.Block
			blk, rest = pem.Decode(rest)
			if blk == nil {
				break
			}
			var pub ed25519.PublicKey
			switch blk.Type {
			case "PUBLIC KEY":
				k, err := x509.ParsePKIXPublicKey(blk.Bytes)
				if err != nil {
					return nil, fmt.Errorf("audit public key %s: %w", p, err)
				}
				var ok bool
				if pub, ok = k.(ed25519.PublicKey); !ok {
					return nil, fmt.Errorf("audit public key %s: %T is not an Ed25519 key", p, k)
				}
			case "PRIVATE KEY":
				s, err := LoadKeyFile(p)
				if err != nil {
					return nil, err
				}
				pub = s.Public()
			default:
				continue
			}
			keys[KeyID(pub)] = pub
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no Ed25519 public key in %s", strings.Join(paths, ", "))
	}
	return keys, nil
}

// Sink is where checkpoints are kept, outside the database: a local
// directory (DirSink) or an S3 bucket with Object Lock (package s3sink).
type Sink interface {
	// Put stores a new object; it fails if name exists.
	Put(ctx context.Context, name string, data []byte) error
	// List returns the checkpoint object names after after ("" for all),
	// in order.
	List(ctx context.Context, after string) ([]string, error)
	Get(ctx context.Context, name string) ([]byte, error)
	String() string
}

// DirSink keeps checkpoints as files in a directory (muster dev's
// default). Files are created once and never rewritten; nothing stops the
// host's administrator from deleting them, which is why production uses
// S3 Object Lock.
type DirSink struct{ Dir string }

// Put implements Sink: write a temporary file, sync it, and hard-link it
// into place, which fails if the name exists.
func (d DirSink) Put(_ context.Context, name string, data []byte) error {
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return fmt.Errorf("checkpoint directory: %w", err)
	}
	if err := writeLinked(filepath.Join(d.Dir, name), data, 0o444); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", name, err)
	}
	if dir, err := os.Open(d.Dir); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	return nil
}

// List implements Sink.
func (d DirSink) List(_ context.Context, after string) ([]string, error) {
	ents, err := os.ReadDir(d.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".json") && !strings.HasPrefix(n, ".") && n > after {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Get implements Sink.
func (d DirSink) Get(_ context.Context, name string) ([]byte, error) {
	if strings.ContainsAny(name, `/\`) {
		return nil, fmt.Errorf("checkpoint name %q", name)
	}
	b, err := os.ReadFile(filepath.Join(d.Dir, name))
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	return b, nil
}

func (d DirSink) String() string { return d.Dir }

// LoadCheckpoints reads and checks every checkpoint in sink, oldest first:
// each signature, and the chain they form (N counts up by one from 1; each
// Prev is the hash of the one before). The first failure is a
// *BrokenError naming the checkpoint.
func LoadCheckpoints(ctx context.Context, sink Sink, keys Keys) ([]Checkpoint, error) {
	names, err := sink.List(ctx, "")
	if err != nil {
		return nil, err
	}
	var out []Checkpoint
	for _, name := range names {
		data, err := sink.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		c, err := DecodeCheckpoint(data, keys)
		if err != nil {
			return nil, &BrokenError{Checkpoint: name, Kind: "signature", Reason: err.Error()}
		}
		var prev *Checkpoint
		if len(out) > 0 {
			prev = &out[len(out)-1]
		}
		if err := checkLink(name, prev, c); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// checkLink checks that c, stored as name, follows prev in the checkpoint
// chain (prev nil: c should be the first).
func checkLink(name string, prev *Checkpoint, c Checkpoint) error {
	switch {
	case name != c.Name():
		return &BrokenError{Seq: c.Seq, Checkpoint: name, Kind: "checkpoint-chain", Reason: fmt.Sprintf("the object holds checkpoint %d", c.N)}
	case prev == nil && c.N != 1:
		return &BrokenError{Seq: c.Seq, Checkpoint: name, Kind: "checkpoint-chain", Reason: fmt.Sprintf("checkpoints 1 to %d are missing", c.N-1)}
	case prev == nil && c.Prev != nil:
		return &BrokenError{Seq: c.Seq, Checkpoint: name, Kind: "checkpoint-chain", Reason: "the first checkpoint names a previous one"}
	case prev == nil:
		return nil
	case c.N != prev.N+1:
		return &BrokenError{Seq: c.Seq, Checkpoint: name, Kind: "checkpoint-chain", Reason: fmt.Sprintf("checkpoint %d follows checkpoint %d: checkpoints %d to %d are missing", c.N, prev.N, prev.N+1, c.N-1)}
	case !bytes.Equal(c.Prev, prev.Hash()):
		return &BrokenError{Seq: c.Seq, Checkpoint: name, Kind: "checkpoint-chain", Reason: fmt.Sprintf("it names previous checkpoint %x, but checkpoint %d hashes %x", c.Prev, prev.N, prev.Hash())}
	case c.Seq < prev.Seq:
		return &BrokenError{Seq: c.Seq, Checkpoint: name, Kind: "rollback", Reason: fmt.Sprintf("it records seq %d, behind checkpoint %d's seq %d", c.Seq, prev.N, prev.Seq), LostFrom: c.Seq + 1, LostTo: prev.Seq}
	case c.Seq == prev.Seq && !bytes.Equal(c.Head, prev.Head):
		return &BrokenError{Seq: c.Seq, Checkpoint: name, Kind: "rewritten", Reason: fmt.Sprintf("it records a different head for seq %d than checkpoint %d", c.Seq, prev.N)}
	}
	return nil
}

// keyFileMode refuses a key file that others may read or anyone but its
// owner may write. Its group may read it only when that group is one of
// this process's own: how Kubernetes mounts a Secret for a pod that does
// not run as root (owned by root, group the pod's fsGroup, mode 0440), so
// only the pod's own processes can read it.
//
// Under p.AllowShared a file its group or others may read, but nobody
// but its owner write, is accepted when readOnly says it lies on a
// read-only mount (a CSI secret store's volume).
func keyFileMode(path string, st fs.FileInfo, p KeyFilePolicy, readOnly func(string) (bool, error)) error {
	m := st.Mode().Perm()
	if m&0o027 == 0 && (m&0o040 == 0 || ownGroup(st)) {
		return nil
	}
	refused := fmt.Errorf("audit signing key %s has mode %04o: it must be readable by its owner only (chmod 600 %s), or also by its group when that is this process's own (a Kubernetes Secret under fsGroup)", path, m, path)
	if m&0o022 != 0 {
		return refused
	}
	if !p.AllowShared {
		return fmt.Errorf("%w; a file others may read is accepted only on a read-only mount (a CSI secret store's volume) with MUSTER_SECRET_FILES_ALLOW_SHARED=true", refused)
	}
	ro, err := readOnly(path)
	if err != nil {
		return fmt.Errorf("audit signing key %s: look at its mount: %w", path, err)
	}
	if !ro {
		return fmt.Errorf("%w; MUSTER_SECRET_FILES_ALLOW_SHARED=true accepts a file others may read only on a read-only mount (a CSI secret store's volume), and %s is on a writable one", refused, path)
	}
	return nil
}

// ownGroup reports whether st's group is this process's effective group
// or one of its supplementary groups.
func ownGroup(st fs.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	gid := int(sys.Gid)
	if gid == os.Getegid() {
		return true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, gid)
}
