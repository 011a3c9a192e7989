//! A hot word as a sequential object: what stateright's tester replays a
//! history against.

use stateright::semantics::SequentialSpec;

use super::history::{WordOp, WordRet};

/// One 8-byte word and its value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Word(pub u64);

impl SequentialSpec for Word {
    type Op = WordOp;
    type Ret = WordRet;

    fn invoke(&mut self, op: &WordOp) -> WordRet {
        let old = self.0;
        match *op {
            WordOp::Read => WordRet::Read(old),
            WordOp::Write(value) => {
                self.0 = value;
                WordRet::Write
            }
            WordOp::CompareSwap { expected, new } => {
                if old == expected {
                    self.0 = new;
                }
                WordRet::CompareSwap(old)
            }
            WordOp::FetchAdd(delta) => {
                self.0 = old.wrapping_add(delta);
                WordRet::FetchAdd(old)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_reads_writes_swaps_and_adds() {
        let mut w = Word(5);
        assert_eq!(w.invoke(&WordOp::Read), WordRet::Read(5));
        assert_eq!(w.invoke(&WordOp::Write(7)), WordRet::Write);
        let miss = WordOp::CompareSwap {
            expected: 5,
            new: 1,
        };
        assert_eq!(w.invoke(&miss), WordRet::CompareSwap(7));
        assert_eq!(w, Word(7));
        let hit = WordOp::CompareSwap {
            expected: 7,
            new: 1,
        };
        assert_eq!(w.invoke(&hit), WordRet::CompareSwap(7));
        assert_eq!(w.invoke(&WordOp::FetchAdd(u64::MAX)), WordRet::FetchAdd(1));
        assert_eq!(w, Word(0));
        assert!(!w.is_valid_step(&WordOp::Read, &WordRet::Read(1)));
    }
}
