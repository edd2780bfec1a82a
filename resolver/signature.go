package resolver

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Signature is a view's signature by the region's key, as muster
// publishes it in each view and delta (a delta carries the signature of
// the view it produces). Replica is the muster replica that signed it,
// KeyID names the key (the first 8 bytes of the SHA-256 of the Ed25519
// public key, in hex), Sig is the Ed25519 signature in standard base64.
type Signature struct {
	Replica string `json:"replica"`
	KeyID   string `json:"key_id"`
	Sig     string `json:"sig"`
}

// ErrSignature is wrapped when a client configured with the region's
// keys (WithViewKeys, Config.ViewKeys) is sent a view or delta that is not
// signed by one of them over exactly what it holds: nothing changed, and
// the client resubscribes for a full view.
var ErrSignature = errors.New("resolver: view not signed by the region's key")

// signatureDomain starts every signed message; it must stay equal to
// muster's assembler.SignatureDomain (a test cross-checks the two).
const signatureDomain = "muster/view/v1"

// WithViewKeys makes the Cache refuse every view and delta of this
// region's services that is not signed by one of keys (by key id) over
// its service, version, endpoints and zones: the checksum alone is a
// public function of the endpoints, which anyone able to put bytes in
// front of the client could compute. Unsigned updates are refused too.
// Without keys (nil or empty) updates are taken on their checksum, as
// before. Peer regions' series ("web@eu") are not checked by these keys.
func WithViewKeys(keys map[string]ed25519.PublicKey) Option {
	return func(c *config) { c.viewKeys = maps.Clone(keys) }
}

// LoadViewKeys reads the region's public keys from PEM files (PUBLIC
// KEY blocks of Ed25519 keys, the files muster's
// MUSTER_AUDIT_PUBLIC_KEY_FILES names), by key id.
func LoadViewKeys(paths ...string) (map[string]ed25519.PublicKey, error) {
	keys := map[string]ed25519.PublicKey{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("resolver: view key: %w", err)
		}
		for rest := b; ; {
			var blk *pem.Block
			blk, rest = pem.Decode(rest)
			if blk == nil {
				break
			}
			if blk.Type != "PUBLIC KEY" {
				continue
			}
			k, err := x509.ParsePKIXPublicKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("resolver: view key %s: %w", p, err)
			}
			pub, ok := k.(ed25519.PublicKey)
			if !ok {
				return nil, fmt.Errorf("resolver: view key %s: %T is not an Ed25519 key", p, k)
			}
			keys[KeyID(pub)] = pub
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("resolver: no Ed25519 public key in %s", strings.Join(paths, ", "))
	}
	return keys, nil
}

// KeyID names a public key as muster does: the first 8 bytes of its
// SHA-256, in hex.
func KeyID(pub ed25519.PublicKey) string {
	d := sha256.Sum256(pub)
	return hex.EncodeToString(d[:8])
}

// zonesDigest is muster's digest of a view's zones (assembler.ZonesDigest):
// the zone count, then per zone in name order the netstrings of name,
// guard, eligible, total, registered, min_healthy_fraction and
// traffic_weight. A field an earlier muster left out is an empty
// netstring, so such a view never verifies.
func zonesDigest(zones map[string]Zone) string {
	var num [32]byte
	b := netstringB(nil, strconv.AppendInt(num[:0], int64(len(zones)), 10))
	for _, name := range slices.Sorted(maps.Keys(zones)) {
		z := zones[name]
		b = netstring(b, name)
		b = netstring(b, z.Guard)
		b = netstringB(b, strconv.AppendInt(num[:0], int64(z.Eligible), 10))
		b = netstringB(b, strconv.AppendInt(num[:0], int64(z.Total), 10))
		if z.Registered != nil {
			b = netstringB(b, strconv.AppendInt(num[:0], int64(*z.Registered), 10))
		} else {
			b = netstring(b, "")
		}
		b = netstringB(b, strconv.AppendFloat(num[:0], z.MinHealthyFraction, 'g', -1, 64))
		if z.TrafficWeight != nil {
			b = netstringB(b, strconv.AppendFloat(num[:0], *z.TrafficWeight, 'g', -1, 64))
		} else {
			b = netstring(b, "")
		}
	}
	d := sha256.Sum256(b)
	return hex.EncodeToString(d[:])
}

// signedMessage is what a view's signature signs (muster's
// assembler.SignedMessage).
func signedMessage(service string, version uint64, checksum, zones, replica string) []byte {
	b := append([]byte(signatureDomain), 0)
	b = netstring(b, service)
	var num [20]byte
	b = netstringB(b, strconv.AppendUint(num[:0], version, 10))
	b = netstring(b, checksum)
	b = netstring(b, zones)
	return netstring(b, replica)
}

// verifySignature checks sig over (service, version, sum, zones) with
// keys. sum is the checksum the client computed itself.
func verifySignature(keys map[string]ed25519.PublicKey, sig *Signature, service string, version uint64, sum sum256, zones map[string]Zone) error {
	if sig == nil || sig.Sig == "" {
		return fmt.Errorf("%w: unsigned", ErrSignature)
	}
	pub, ok := keys[sig.KeyID]
	if !ok {
		return fmt.Errorf("%w: key %q is not one of the region's", ErrSignature, sig.KeyID)
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(sig.Sig)
	if err != nil || len(raw) != ed25519.SignatureSize || base64.StdEncoding.EncodeToString(raw) != sig.Sig {
		return fmt.Errorf("%w: malformed signature", ErrSignature)
	}
	if !ed25519.Verify(pub, signedMessage(service, version, sum.String(), zonesDigest(zones), sig.Replica), raw) {
		return fmt.Errorf("%w: the signature does not match %s v%d", ErrSignature, service, version)
	}
	return nil
}

// verifies reports whether the Cache checks signatures for svc: keys are
// configured and it is one of this region's services.
func (c *Cache) verifies(svc *service) bool {
	return len(c.cfg.viewKeys) > 0 && strings.IndexByte(svc.name, '@') < 0
}
