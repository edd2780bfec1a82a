package assembler

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// SignatureDomain starts every view signature's message, so that a view
// signature can never pass for a seal, a checkpoint or a peer request
// signed by the same key (and none of those for a view signature).
const SignatureDomain = "muster/view/v1"

// Signature is a view's signature by the region's key: it travels in the
// view and in each delta (a delta carries the signature of the view it
// produces). Replica is the replica that signed it, which must be the
// owner of the service's shard under the version's epoch (a sealed
// tenure); KeyID names the key (audit.KeyID); Sig is the Ed25519
// signature of SignedMessage, in standard base64.
type Signature struct {
	Replica string `json:"replica"`
	KeyID   string `json:"key_id"`
	Sig     string `json:"sig"`
}

// ViewSigner signs a view as it is published (SignWith builds one). It
// is called with the publisher's lock held, once per version (never per
// subscriber), so it must be fast and do no I/O: a local Ed25519 key. It
// returns nil when it cannot sign; the view is then published unsigned
// (withdrawals are never held back for a signature) and peers and
// verifying clients refuse it.
type ViewSigner func(service string, version uint64, checksum, zonesDigest string) *Signature

// SignWith returns a ViewSigner that signs as replica with sign, the
// region's key named keyID. onError, when set, is told of a failure.
func SignWith(replica, keyID string, sign func(msg []byte) ([]byte, error), onError func(error)) ViewSigner {
	return func(service string, version uint64, checksum, zonesDigest string) *Signature {
		sig, err := sign(SignedMessage(service, version, checksum, zonesDigest, replica))
		if err != nil {
			if onError != nil {
				onError(fmt.Errorf("sign view %s v%d: %w", service, version, err))
			}
			return nil
		}
		return &Signature{Replica: replica, KeyID: keyID, Sig: base64.StdEncoding.EncodeToString(sig)}
	}
}

// ZonesDigest is the SHA-256, in hex, of the canonical encoding of a
// view's zone statuses: everything a view carries that steers traffic and
// the checksum does not cover (the guard's decision and the shift-backs'
// traffic weights). The encoding is the zone count, then for each zone in
// name order the netstrings of name, guard, eligible, total, registered
// (decimal), min_healthy_fraction and traffic_weight (strconv 'g' -1).
func ZonesDigest(zones map[string]ZoneStatus) string {
	var num [32]byte
	b := netstring(nil, strconv.AppendInt(num[:0], int64(len(zones)), 10))
	for _, name := range slices.Sorted(maps.Keys(zones)) {
		z := zones[name]
		b = netstringS(b, name)
		b = netstringS(b, z.Guard)
		b = netstring(b, strconv.AppendInt(num[:0], int64(z.Eligible), 10))
		b = netstring(b, strconv.AppendInt(num[:0], int64(z.Total), 10))
		b = netstring(b, strconv.AppendInt(num[:0], int64(z.Registered), 10))
		b = netstring(b, strconv.AppendFloat(num[:0], z.MinHealthyFraction, 'g', -1, 64))
		b = netstring(b, strconv.AppendFloat(num[:0], z.TrafficWeight, 'g', -1, 64))
	}
	d := sha256.Sum256(b)
	return hex.EncodeToString(d[:])
}

// SignedMessage is the exact bytes a view's signature signs: the domain,
// a NUL, then the netstrings of the service, the version (decimal), the
// checksum, the zones digest and the signing replica's id. The checksum
// stands for the endpoints; a verifier recomputes it and the zones digest
// from the view it holds, never trusting the fields.
func SignedMessage(service string, version uint64, checksum, zonesDigest, replica string) []byte {
	b := make([]byte, 0, len(SignatureDomain)+1+len(service)+len(checksum)+len(zonesDigest)+len(replica)+48)
	b = append(b, SignatureDomain...)
	b = append(b, 0)
	b = netstringS(b, service)
	var num [20]byte
	b = netstring(b, strconv.AppendUint(num[:0], version, 10))
	b = netstringS(b, checksum)
	b = netstringS(b, zonesDigest)
	return netstringS(b, replica)
}

// Errors VerifyView wraps.
var (
	ErrUnsigned     = errors.New("view is not signed")
	ErrUntrustedKey = errors.New("view is signed by a key this replica does not trust")
	ErrForged       = errors.New("view's signature does not verify")
)

// VerifyView checks that v carries a valid signature by one of keys over
// its own service, version, endpoints (their checksum, recomputed here:
// the view's checksum field is compared, never trusted) and zones. It
// returns the signature that verified.
func VerifyView(keys map[string]ed25519.PublicKey, v *View) (*Signature, error) {
	var scratch []byte
	eps := slices.Clone(v.Endpoints)
	slices.SortFunc(eps, compareEndpoints)
	sum := checksumSorted(eps, &scratch)
	if sum != v.Checksum {
		return nil, fmt.Errorf("%w: its checksum %s is not its endpoints' (%s)", ErrForged, v.Checksum, sum)
	}
	return VerifySignature(keys, v.Signature, v.Service, v.Version, sum, ZonesDigest(v.Zones))
}

// VerifySignature checks sig over (service, version, checksum,
// zonesDigest), as computed by the caller.
func VerifySignature(keys map[string]ed25519.PublicKey, sig *Signature, service string, version uint64, checksum, zonesDigest string) (*Signature, error) {
	if sig == nil || sig.Sig == "" {
		return nil, ErrUnsigned
	}
	pub, ok := keys[sig.KeyID]
	if !ok || len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w (key %q)", ErrUntrustedKey, sig.KeyID)
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(sig.Sig)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return nil, fmt.Errorf("%w: the signature is not %d bytes of base64", ErrForged, ed25519.SignatureSize)
	}
	if base64.StdEncoding.EncodeToString(raw) != sig.Sig {
		// One signature, one text: no second spelling of it passes.
		return nil, fmt.Errorf("%w: the signature is not in canonical base64", ErrForged)
	}
	if !ed25519.Verify(pub, SignedMessage(service, version, checksum, zonesDigest, sig.Replica), raw) {
		return nil, ErrForged
	}
	return sig, nil
}

// sign signs view v (its Checksum and Zones set) with the assembler's
// signer, if any.
func (a *Assembler) sign(v *View) *Signature {
	if a.opts.Sign == nil {
		return nil
	}
	return a.opts.Sign(v.Service, v.Version, v.Checksum, ZonesDigest(v.Zones))
}
