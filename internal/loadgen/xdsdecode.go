package loadgen

import (
	"errors"
	"fmt"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The field numbers the wire decoder reads, taken from the generated
// descriptors so that they cannot drift from the schema.
var (
	fieldCLAEndpoints    = fieldNumber(&endpoint.ClusterLoadAssignment{}, "endpoints")
	fieldLocalityLbEps   = fieldNumber(&endpoint.LocalityLbEndpoints{}, "lb_endpoints")
	fieldLbEpEndpoint    = fieldNumber(&endpoint.LbEndpoint{}, "endpoint")
	fieldLbEpHealth      = fieldNumber(&endpoint.LbEndpoint{}, "health_status")
	fieldEndpointAddress = fieldNumber(&endpoint.Endpoint{}, "address")
	fieldAddressSocket   = fieldNumber(&core.Address{}, "socket_address")
	fieldSocketAddress   = fieldNumber(&core.SocketAddress{}, "address")
	fieldSocketPort      = fieldNumber(&core.SocketAddress{}, "port_value")
)

func fieldNumber(m proto.Message, name protoreflect.Name) protowire.Number {
	f := m.ProtoReflect().Descriptor().Fields().ByName(name)
	if f == nil {
		panic(fmt.Sprintf("loadgen: %s has no field %s", m.ProtoReflect().Descriptor().FullName(), name))
	}
	return f.Number()
}

var errWire = errors.New("malformed ClusterLoadAssignment")

// decodeAssignmentWire reads every endpoint of an encoded
// ClusterLoadAssignment and calls each with its SocketAddress's encoding
// (which names the endpoint: socketAddress decodes it) and its health
// status, walking the wire format instead of building the message:
// protobuf-go's Unmarshal allocates every nested message of each of the
// assignment's endpoints (about 50 µs for 60 endpoints here), and
// 10,000 streams decoding on the cores muster runs on would time the
// client, not muster. `muster loadgen xds --decode proto` decodes with
// Unmarshal instead; TestDecodeAssignmentWire holds the two alike.
func decodeAssignmentWire(b []byte, each func(sa []byte, health core.HealthStatus)) error {
	for len(b) > 0 {
		n, v, _, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		if n != fieldCLAEndpoints || v == nil {
			continue
		}
		for loc := v; len(loc) > 0; {
			n, v, _, rest, err := field(loc)
			if err != nil {
				return err
			}
			loc = rest
			if n != fieldLocalityLbEps || v == nil {
				continue
			}
			sa, health, err := lbEndpoint(v)
			if err != nil {
				return err
			}
			each(sa, health)
		}
	}
	return nil
}

// lbEndpoint is an LbEndpoint's SocketAddress encoding and health.
func lbEndpoint(b []byte) (sa []byte, health core.HealthStatus, err error) {
	for len(b) > 0 {
		n, v, x, rest, err := field(b)
		if err != nil {
			return nil, 0, err
		}
		b = rest
		switch {
		case n == fieldLbEpHealth && v == nil:
			health = core.HealthStatus(x)
		case n == fieldLbEpEndpoint && v != nil:
			addr, err := last(v, fieldEndpointAddress)
			if err != nil {
				return nil, 0, err
			}
			if sa, err = last(addr, fieldAddressSocket); err != nil {
				return nil, 0, err
			}
		}
	}
	return sa, health, nil
}

// socketAddress decodes a SocketAddress's address and port.
func socketAddress(b []byte) (lgEndpoint, error) {
	var ep lgEndpoint
	for len(b) > 0 {
		n, v, x, rest, err := field(b)
		if err != nil {
			return lgEndpoint{}, err
		}
		b = rest
		switch {
		case n == fieldSocketAddress && v != nil:
			ep.addr = string(v)
		case n == fieldSocketPort && v == nil:
			ep.port = uint32(x)
		}
	}
	return ep, nil
}

// last is the bytes of the last length-delimited field n of a message
// (protobuf merges repeated occurrences of a message field; the last
// one's scalars win, and muster writes each once).
func last(b []byte, n protowire.Number) ([]byte, error) {
	var found []byte
	for len(b) > 0 {
		m, v, _, rest, err := field(b)
		if err != nil {
			return nil, err
		}
		b = rest
		if m == n && v != nil {
			found = v
		}
	}
	return found, nil
}

// field consumes one field of a message's encoding: its number, its
// bytes when length-delimited (else nil) or its value when a varint.
func field(b []byte) (n protowire.Number, v []byte, x uint64, rest []byte, err error) {
	n, t, k := protowire.ConsumeTag(b)
	if k < 0 {
		return 0, nil, 0, nil, errWire
	}
	b = b[k:]
	switch t {
	case protowire.BytesType:
		v, k = protowire.ConsumeBytes(b)
		if v == nil && k >= 0 {
			v = []byte{}
		}
	case protowire.VarintType:
		x, k = protowire.ConsumeVarint(b)
	default:
		k = protowire.ConsumeFieldValue(n, t, b)
	}
	if k < 0 {
		return 0, nil, 0, nil, errWire
	}
	return n, v, x, b[k:], nil
}
