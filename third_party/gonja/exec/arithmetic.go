package exec

import (
	"math"

	"github.com/pkg/errors"

	"github.com/nikolalohinski/gonja/v2/tokens"
)

// pythonArithmetic evaluates /, //, % and ** on numbers as Python does: / always gives a
// float; // and % round towards negative infinity (-7 // 2 is -4, -7 % 3 is 2) and give
// integers for integers; ** of integers with an exponent >= 0 is an integer; dividing by
// zero is an error. Booleans count as the integers 0 and 1. Other operands (Python's
// string formatting with %) are an error.
func pythonArithmetic(op tokens.Type, left, right *Value) *Value {
	if !(left.IsNumber() || left.IsBool()) || !(right.IsNumber() || right.IsBool()) {
		return AsValue(errors.Errorf(`unsupported operand types for %s: %s and %s`, opName(op), left.String(), right.String()))
	}
	if !left.IsFloat() && !right.IsFloat() {
		a, b := left.Integer(), right.Integer()
		switch op {
		case tokens.FloorDivision, tokens.Modulo:
			if b == 0 {
				return AsValue(errors.New(`integer division or modulo by zero`))
			}
			q, r := a/b, a%b
			if r != 0 && (r < 0) != (b < 0) {
				q, r = q-1, r+b
			}
			if op == tokens.FloorDivision {
				return AsValue(q)
			}
			return AsValue(r)
		case tokens.Power:
			if b >= 0 {
				p := 1
				for ; b > 0; b-- {
					p *= a
				}
				return AsValue(p)
			}
		}
	}
	a, b := left.Float(), right.Float()
	switch op {
	case tokens.Division:
		if b == 0 {
			return AsValue(errors.New(`division by zero`))
		}
		return AsValue(a / b)
	case tokens.FloorDivision:
		if b == 0 {
			return AsValue(errors.New(`float floor division by zero`))
		}
		return AsValue(math.Floor(a / b))
	case tokens.Modulo:
		if b == 0 {
			return AsValue(errors.New(`float modulo by zero`))
		}
		r := math.Mod(a, b)
		if r != 0 && (r < 0) != (b < 0) {
			r += b
		}
		return AsValue(r)
	default:
		if a == 0 && b < 0 {
			return AsValue(errors.New(`zero to a negative power`))
		}
		return AsValue(math.Pow(a, b))
	}
}

func opName(op tokens.Type) string {
	switch op {
	case tokens.Division:
		return "/"
	case tokens.FloorDivision:
		return "//"
	case tokens.Modulo:
		return "%"
	default:
		return "**"
	}
}
