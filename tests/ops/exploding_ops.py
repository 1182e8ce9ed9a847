"""A Mapper that raises on row id 7, every time: a shard whose op error recurs on each attempt."""

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("dje_test_exploding_mapper")
class DjeTestExplodingMapper(Mapper):
    def process_single(self, sample):
        if sample["id"] == 7:
            raise ValueError("row 7 is cursed")
        return sample
