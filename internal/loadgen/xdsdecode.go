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
// ClusterLoadAssignment (address, port, health status) and calls each
// for it, walking the wire format instead of building the message:
// protobuf-go's Unmarshal allocates every nested message of each of the
// assignment's endpoints (about 80 µs for 60 endpoints here), and
// 10,000 streams decoding on the cores muster runs on would time the
// client, not muster. `muster loadgen xds --decode proto` decodes with
// Unmarshal instead; TestDecodeAssignmentWire holds the two alike.
func decodeAssignmentWire(b []byte, each func(ep lgEndpoint, health core.HealthStatus)) error {
	return fields(b, func(n protowire.Number, t protowire.Type, v []byte, _ uint64) error {
		if n != fieldCLAEndpoints || t != protowire.BytesType {
			return nil
		}
		return fields(v, func(n protowire.Number, t protowire.Type, v []byte, _ uint64) error {
			if n != fieldLocalityLbEps || t != protowire.BytesType {
				return nil
			}
			var ep lgEndpoint
			health := core.HealthStatus_UNKNOWN
			err := fields(v, func(n protowire.Number, t protowire.Type, v []byte, x uint64) error {
				switch {
				case n == fieldLbEpHealth && t == protowire.VarintType:
					health = core.HealthStatus(x)
				case n == fieldLbEpEndpoint && t == protowire.BytesType:
					return nested(v, []protowire.Number{fieldEndpointAddress, fieldAddressSocket}, func(sa []byte) error {
						return fields(sa, func(n protowire.Number, t protowire.Type, v []byte, x uint64) error {
							switch {
							case n == fieldSocketAddress && t == protowire.BytesType:
								ep.addr = string(v)
							case n == fieldSocketPort && t == protowire.VarintType:
								ep.port = uint32(x)
							}
							return nil
						})
					})
				}
				return nil
			})
			if err == nil {
				each(ep, health)
			}
			return err
		})
	})
}

// nested finds the message at path (each a length-delimited field of
// the one before) and calls f with its bytes; the last occurrence wins,
// as in protobuf's merge.
func nested(b []byte, path []protowire.Number, f func([]byte) error) error {
	var found []byte
	err := fields(b, func(n protowire.Number, t protowire.Type, v []byte, _ uint64) error {
		if n == path[0] && t == protowire.BytesType {
			found = v
		}
		return nil
	})
	if err != nil || found == nil {
		return err
	}
	if len(path) == 1 {
		return f(found)
	}
	return nested(found, path[1:], f)
}

// fields calls f with each field of a message's encoding: its number,
// wire type, and its bytes (length-delimited) or value (varint).
func fields(b []byte, f func(n protowire.Number, t protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		n, t, k := protowire.ConsumeTag(b)
		if k < 0 {
			return errWire
		}
		b = b[k:]
		var v []byte
		var x uint64
		switch t {
		case protowire.BytesType:
			v, k = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, k = protowire.ConsumeVarint(b)
		default:
			k = protowire.ConsumeFieldValue(n, t, b)
		}
		if k < 0 {
			return errWire
		}
		b = b[k:]
		if err := f(n, t, v, x); err != nil {
			return err
		}
	}
	return nil
}
